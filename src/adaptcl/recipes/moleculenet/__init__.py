"""``adaptcl moleculenet``: GraphCL on molecules (config, data, pre-training and fine-tuning, the recipe)."""
