"""``adaptcl clip``: CLIP from scratch on CIFAR-10 with prompt captions (docs/recipes/clip.md)."""
