"""``adaptcl tu``: GraphCL on TU datasets (config, data, one cell's training, the recipe)."""
