"""``adaptcl sts``: a frozen sentence encoder on STS12-16, STS-B and SICK-R (config, the recipe)."""
