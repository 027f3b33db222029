"""Print the configuration reference (a markdown table per section) from the pydantic models.

The README's "Configuration reference" is this script's output:
    python scripts/config_reference.py
"""

from __future__ import annotations

from pydantic import BaseModel

from grpo_dist.config import Config


def rows(model: type[BaseModel], prefix: str) -> list[str]:
    lines = []
    defaults = model()
    for name, field in model.model_fields.items():
        value = getattr(defaults, name)
        if isinstance(value, BaseModel):
            lines += rows(type(value), f"{prefix}{name}.")
            continue
        shown = value
        if isinstance(value, list):
            shown = [item.model_dump() if isinstance(item, BaseModel) else item for item in value]
        lines.append(f"| `{prefix}{name}` | `{shown!r}` | {field.description or ''} |")
    return lines


def main() -> None:
    for section, field in Config.model_fields.items():
        print(f"\n**{section}**\n\n| field | default | meaning |\n|---|---|---|")
        print("\n".join(rows(field.annotation, f"{section}.")))


if __name__ == "__main__":
    main()
