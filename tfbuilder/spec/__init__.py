"""The recipe schema (pydantic): the recipe and its sections, the sources (positions of YAML
values), recipe diffs, the sequence head's section.

May import the bottom modules only. No torch, and no file reads but the recipe's YAML.
"""
