"""Warnings as failures (`--strict`, `strict=True`): a comparison whose report warns that a
check could not fail, or could not see a bug of the size it names (judge/vacuous.py), or that
the baseline itself trained unstably (judge/unstable.py), fails with the code `warned`. Without
it such a comparison passes, its warning said beside the verdict; a gate that must not pass what
it could not check asks for this. Model zoo run 292002 (GPT-2 under transformers' Adafactor, the
loss not divided by K from update 8): every gradient was allowed 0.28 times its own size or
more, the warning said so, and the run passed."""

from __future__ import annotations

from .results import FAIL, Check, Comparison, Diagnosis

WARNING = "warning: "
CODE = "warned"
CHECK = "warnings (--strict)"
FIX = (
    "follow each warning's own advice (a float64 rerun of the baseline as the reference, the "
    "runs recorded at a higher precision, tolerances in the data's units), or judge without "
    "--strict to accept a pass that could not see what the warning names"
)


def fail_on_warnings(c: Comparison) -> Comparison:
    """`c` failed by its warnings, where it has any (in place; returned for chaining): a failing
    check that lists them, and, where nothing else named the failure, the `warned` diagnosis."""
    warned = [n[len(WARNING) :] for n in c.notes if n.startswith(WARNING)]
    if not warned or any(check.name == CHECK for check in c.checks):
        return c  # nothing to fail, or failed already
    more = f" (and {len(warned) - 1} more)" if len(warned) > 1 else ""
    c.checks.append(Check(CHECK, FAIL, f"{warned[0]}{more}"))
    if not any(d.severity == "error" for d in c.diagnosis):
        message = (
            f"judged with --strict, and the report warns: {warned[0]}{more}; every weight, "
            "gradient and loss check passed otherwise"
        )
        c.diagnosis.insert(0, Diagnosis(CODE, message, {"warnings": warned}, FIX))
    return c
