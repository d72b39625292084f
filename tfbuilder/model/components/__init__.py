"""Built-in components, one family per module. Importing a module registers its components.

Shape vocabulary (used in every docstring and einops pattern): ``b`` batch, ``n`` positions,
``i`` query positions, ``j`` key positions, ``d`` model width, ``h`` heads, ``k`` key width per head,
``v`` value width per head.
"""
