"""Allocation: what a candidate is and what it costs.

The allocation (`config`), the search-space language (`knobs`, `space`), fitting a candidate to the
budget (`fit`), exact analytic accounting (`budget`), and the `torch.nn.Module` an allocation builds
(`sharing`, `transformer`). Nothing here trains, stores or schedules anything.
"""
