"""Where the transformers oracle fixtures live (made by scripts/make_oracle_fixtures.py)."""
import os

ORACLE = os.path.join(os.path.dirname(__file__), "..", "fixtures", "oracle")
ORACLE_TYPES = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")


def oracle_dir(model_type: str) -> str:
    return os.path.join(ORACLE, model_type)
