"""Recipes: typed configs, a CLI entry each, atomic JSON results, markdown tables and plots."""
