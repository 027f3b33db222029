"""Both generation engines implement the GenerationEngine protocol, and the protocol holds every
method the rollout worker and the episode runner call on an engine. Read from the source (ast),
so that the check costs no vLLM import."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "grpo_dist"
ENGINES = {"HFEngine": "rollout/hf_engine.py", "VLLMEngine": "rollout/vllm_engine.py"}


def methods(path: str, class_name: str) -> tuple[list[str], dict[str, str]]:
    """The class's base names and its public methods' signatures (parameters -> return), as source text."""
    tree = ast.parse((PACKAGE / path).read_text())
    cls = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == class_name)
    signatures = {node.name: f"({ast.unparse(node.args)}) -> {ast.unparse(node.returns) if node.returns else None}"
                  for node in cls.body if isinstance(node, ast.FunctionDef) and not node.name.startswith("_")}
    return [ast.unparse(base) for base in cls.bases], signatures


def test_every_engine_defines_each_protocol_method_with_its_signature():
    _, protocol = methods("rollout/engine.py", "GenerationEngine")
    for name, path in ENGINES.items():
        bases, signatures = methods(path, name)
        assert "GenerationEngine" in bases, f"{name} does not declare the GenerationEngine protocol"
        for method, signature in protocol.items():
            assert method in signatures, f"{name}.{method} is missing (only the protocol's stub)"
            assert signatures[method] == signature, f"{name}.{method}{signatures[method]} != protocol's {signature}"


def test_the_protocol_has_every_method_called_on_an_engine():
    _, protocol = methods("rollout/engine.py", "GenerationEngine")
    called = set()
    for path in ("rollout/worker.py", "env/runner.py"):
        for node in ast.walk(ast.parse((PACKAGE / path).read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "engine"):
                called.add(node.func.attr)
    assert called and called <= protocol.keys(), f"called on an engine, not in the protocol: {called - protocol.keys()}"
