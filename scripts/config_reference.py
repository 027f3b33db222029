"""Print the configuration reference (a markdown table per section) from the pydantic models.

docs/config.md is this script's output, and tests/test_docs.py checks that it is current:
    python scripts/config_reference.py > docs/config.md
"""

from __future__ import annotations

import typing

from pydantic import BaseModel

from grpo_dist.config.schema import Config


def optional_section(annotation: object) -> type[BaseModel] | None:
    """S for an annotation `S | None` where S is a section (learner.lora); else None."""
    arguments = typing.get_args(annotation)
    members = [a for a in arguments if a is not type(None)]
    if (type(None) in arguments and len(members) == 1 and isinstance(members[0], type)
            and issubclass(members[0], BaseModel)):
        return members[0]
    return None


def rows(model: type[BaseModel], prefix: str) -> list[str]:
    lines = []
    for name, field in model.model_fields.items():
        if field.is_required():  # a field of an optional section that has no default (env.name)
            lines.append(f"| `{prefix}{name}` | required | {field.description or ''} |")
            continue
        value = field.get_default(call_default_factory=True)
        if isinstance(value, BaseModel):
            lines += rows(type(value), f"{prefix}{name}.")
            continue
        shown = value
        if isinstance(value, list):
            shown = [item.model_dump() if isinstance(item, BaseModel) else item for item in value]
        lines.append(f"| `{prefix}{name}` | `{shown!r}` | {field.description or ''} |")
        section = optional_section(field.annotation)
        if section is not None:  # off by default; its fields, with the defaults they take when it is set
            lines += rows(section, f"{prefix}{name}.")
    return lines


HEADER = """# Configuration reference

Every field, its default and what it means, from the pydantic models (grpo_dist/config/schema.py,
config/run.py, env/config.py). Generated: `python scripts/config_reference.py > docs/config.md`
(tests/test_docs.py checks that this file is current). How recipes, `--config` files and
`section.field=value` overrides compose: docs/running.md."""


def main() -> None:
    print(HEADER)
    for section, field in Config.model_fields.items():
        print(f"\n## {section}\n\n| field | default | meaning |\n|---|---|---|")
        optional = optional_section(field.annotation)
        if optional is not None:  # a section that is off by default (env): its row, then its fields when set
            print(f"| `{section}` | `None` | {field.description or ''} |")
        print("\n".join(rows(optional or field.annotation, f"{section}.")))


if __name__ == "__main__":
    main()
