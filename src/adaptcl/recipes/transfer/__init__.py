"""``adaptcl transfer``: a frozen sentence encoder on SentEval's transfer tasks (config, the
recipe)."""
