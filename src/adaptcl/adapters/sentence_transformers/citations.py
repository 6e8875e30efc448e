"""BibTeX entries of the losses, shown in the model card through each loss's ``citation``."""

from __future__ import annotations

__all__ = ["AMCL_CITATION", "ASCL_CITATION", "CLIP_CITATION", "DYSTRESS_CITATION",
           "INFONCE_CITATION", "MACL_CITATION", "SUPCON_CITATION", "TEMPERATURE_SCHEDULE_CITATION"]

MACL_CITATION = """
@inproceedings{huang2023macl,
    title = {Model-Aware Contrastive Learning: Towards Escaping the Dilemmas},
    author = {Huang, Zizheng and Chen, Haoxing and Wen, Ziqi and Zhang, Chao and Li, Huaxiong and Wang, Bo and Chen, Chunlin},
    booktitle = {Proceedings of the 40th International Conference on Machine Learning},
    year = {2023},
    url = {https://arxiv.org/abs/2207.07874},
}
"""

ASCL_CITATION = """
@inproceedings{feng2022ascl,
    title = {Adaptive Soft Contrastive Learning},
    author = {Feng, Chen and Patras, Ioannis},
    booktitle = {26th International Conference on Pattern Recognition (ICPR)},
    year = {2022},
    url = {https://arxiv.org/abs/2207.11163},
}
"""

AMCL_CITATION = """
@inproceedings{wang2024amcl,
    title = {Adaptive Multi-head Contrastive Learning},
    author = {Wang, Lei and Koniusz, Piotr and Gedeon, Tom and Zheng, Liang},
    booktitle = {European Conference on Computer Vision (ECCV)},
    year = {2024},
    url = {https://arxiv.org/abs/2310.05615},
}
"""

INFONCE_CITATION = """
@misc{oord2018cpc,
    title = {Representation Learning with Contrastive Predictive Coding},
    author = {van den Oord, Aaron and Li, Yazhe and Vinyals, Oriol},
    year = {2018},
    eprint = {1807.03748},
    archivePrefix = {arXiv},
}
"""

DYSTRESS_CITATION = """
@article{manna2025dystress,
    title = {Dynamically Scaled Temperature in Self-Supervised Contrastive Learning},
    author = {Manna, Siladittya and Chattopadhyay, Soumitri and Dey, Rakesh and Pal, Umapada and Bhattacharya, Saumik},
    journal = {IEEE Transactions on Artificial Intelligence},
    year = {2025},
    doi = {10.1109/TAI.2024.3524979},
    url = {https://arxiv.org/abs/2308.01140},
}
"""

SUPCON_CITATION = """
@inproceedings{khosla2020supcon,
    title = {Supervised Contrastive Learning},
    author = {Khosla, Prannay and Teterwak, Piotr and Wang, Chen and Sarna, Aaron and Tian, Yonglong and Isola, Phillip and Maschinot, Aaron and Liu, Ce and Krishnan, Dilip},
    booktitle = {Advances in Neural Information Processing Systems},
    year = {2020},
    url = {https://arxiv.org/abs/2004.11362},
}
"""

TEMPERATURE_SCHEDULE_CITATION = """
@inproceedings{kukleva2023temperature,
    title = {Temperature Schedules for self-supervised contrastive methods on long-tail data},
    author = {Kukleva, Anna and B{\\"o}hle, Moritz and Schiele, Bernt and Kuehne, Hilde and Rupprecht, Christian},
    booktitle = {The Eleventh International Conference on Learning Representations (ICLR)},
    year = {2023},
    url = {https://openreview.net/forum?id=ejHUr4nfHhD},
}
"""

CLIP_CITATION = """
@inproceedings{radford2021clip,
    title = {Learning Transferable Visual Models From Natural Language Supervision},
    author = {Radford, Alec and Kim, Jong Wook and Hallacy, Chris and Ramesh, Aditya and Goh, Gabriel and Agarwal, Sandhini and Sastry, Girish and Askell, Amanda and Mishkin, Pamela and Clark, Jack and Krueger, Gretchen and Sutskever, Ilya},
    booktitle = {Proceedings of the 38th International Conference on Machine Learning},
    year = {2021},
    url = {https://arxiv.org/abs/2103.00020},
}
"""
