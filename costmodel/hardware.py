"""The hardware preset names a spec's `hardware:` may name.

Only the names for now: their figures (pydantic models of devices and links)
arrive with the cost-model work.
"""

PRESET_NAMES: tuple[str, ...] = (
    "A100-40GB", "A100-80GB", "H100-SXM", "H200", "V100-32GB", "P100", "TPUv3", "TPUv4", "TPUv5e",
)
