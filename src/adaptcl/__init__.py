"""adaptcl: adaptive contrastive losses (MACL, AMCL, ASCL) for the frameworks you already use.

``adaptcl.plugins`` is the loss core and needs only torch. ``adaptcl.adapters`` wires it into
Lightly, sentence-transformers and torch-geometric; ``adaptcl.recipes`` reproduces the papers'
evaluations.
"""

__version__ = "0.1.0"
