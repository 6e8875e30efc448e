"""``adaptcl images``: self-supervised pre-training on images via Lightly (config, data, one cell's training, the recipe)."""
