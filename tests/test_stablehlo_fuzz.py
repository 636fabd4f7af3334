"""Mutation fuzzing of the StableHLO importer: every mutant of the fixtures
must import or fail with a located `StableHLOError`, never an internal
error (what the CLI reports as exit 70). Seeded; a few seconds."""

import random
import re

import pytest
from conftest import ROOT

from ir.stablehlo import StableHLOError, import_stablehlo

FIXTURES = [ROOT / "tests" / "fixtures" / name for name in (
    "mlp_train.mlir", "stablehlo/scan.mlir", "stablehlo/fori_loop.mlir", "stablehlo/checkpoint_grad.mlir",
    "stablehlo/dynamic_trip_count.mlir", "stablehlo/top_k.mlir", "stablehlo/sort_payload.mlir",
    "stablehlo/switch.mlir", "real/mlp_train_flax.mlir", "real/gpt2_decode.mlir")]
MUTANTS_PER_FIXTURE = 600

# Tokens the mutations substitute: numbers, SSA names, brackets, types, op and attribute words.
TOKEN = re.compile(r"%[\w.#-]+|-?\d+(?:\.\d+)?(?:e[+-]?\d+)?|tensor<[^>]*>|[\w.]+|[\[\](){}<>,:=\"]")
REPLACEMENTS = ["0", "-1", "1", "7", "999999999999", "1.5", "%0", "%arg0", "%nope", "[", "]", "(", ")", "{", "}",
                "<", ">", ",", ":", "=", '"', "tensor<f32>", "tensor<0x3xf32>", "tensor<2x?xf32>", "tensor<3xui32>",
                "stablehlo.add", "stablehlo.while", "dims", "x", "->", "", "0x7FC00000", "true",
                "tensor<2147483648x2xi64>", "tensor<99999999999x4xf32>", "dense<0>", "stablehlo.case", "k"]


def mutate(text: str, rng: random.Random) -> str:
    lines = text.splitlines()
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(len(lines))
        kind = rng.random()
        if kind < 0.15:
            del lines[i]
        elif kind < 0.25:
            lines.insert(rng.randrange(len(lines)), lines[i])
        elif kind < 0.3:
            lines = lines[:i]
        else:
            tokens = list(TOKEN.finditer(lines[i]))
            if tokens:
                m = rng.choice(tokens)
                other = rng.choice(REPLACEMENTS) if rng.random() < 0.7 else rng.choice(tokens).group(0)
                lines[i] = lines[i][:m.start()] + other + lines[i][m.end():]
        if not lines:
            break
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_mutants_import_or_fail_with_a_located_error(path):
    text = path.read_text()
    rng = random.Random(f"fuzz:{path.name}")
    failures = 0
    for k in range(MUTANTS_PER_FIXTURE):
        mutant = mutate(text, rng)
        try:
            import_stablehlo(mutant, "mutant.mlir")
        except StableHLOError as err:
            failures += 1
            assert str(err).startswith("mutant.mlir"), f"mutant {k}: error without the file name: {err}"
        except Exception as err:  # noqa: BLE001 - any other exception is the bug this test looks for
            raise AssertionError(f"mutant {k} of {path.name}: internal error {type(err).__name__}: {err}\n"
                                 f"{mutant}") from err
    assert failures > MUTANTS_PER_FIXTURE // 3  # the mutations do break programs


@pytest.mark.parametrize("huge", ["2147483648x2", "4294967296x4294967296"])
def test_a_huge_splat_attribute_is_refused_at_its_line_not_spelled_out(huge):
    """A mutant of 1 in 1,500 once raised MemoryError: `padding = dense<0>`
    of a tensor type claiming billions of numbers was spelled out in full."""
    text = (ROOT / "tests" / "fixtures" / "real" / "cnn_train.mlir").read_text()
    line = next(i for i, t in enumerate(text.splitlines()) if "reduce_window" in t and "padding = dense<0>" in t)
    lines = text.splitlines()
    lines[line] = lines[line].replace("tensor<4x2xi64>", f"tensor<{huge}xi64>", 1)
    with pytest.raises(StableHLOError, match=rf"mutant.mlir:{line + 1}: .*padding spells [\d,]+ numbers as dense<"
                                             r".*an op of this rank takes at most 8"):
        import_stablehlo("\n".join(lines) + "\n", "mutant.mlir")
