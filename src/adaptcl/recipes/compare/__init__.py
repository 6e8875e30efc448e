"""``adaptcl compare``: one table and plot over a setting, from the result files of several runs."""
