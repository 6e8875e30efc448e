"""``adaptcl demo``: NT-Xent vs MACL on scikit-learn's digits (config, data, model and loop, the recipe)."""
