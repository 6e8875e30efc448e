"""``adaptcl simcse``: SimCSE trained with each loss, then scored on STS (config, data, one
cell's training, the recipe)."""
