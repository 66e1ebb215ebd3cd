"""moecheck.gate and moecheck.shrink with Python callables: the sweep of `moecheck gate` run in
memory through a numpy kernel, correct and with mutants; failures saved, replayable, shrinkable."""
import os

import pytest

import kernels_for_tests as k
import moecheck
from conftest import run_cli


def test_correct_kernel_passes_the_sweep():
    r = moecheck.gate(k.correct, cases=30, seed=1, quiet=True)
    assert r.ok, r.text()
    assert r.cases == 30 and r.passed + r.vacuous == 30 and r.work_dir is None


@pytest.mark.parametrize("mutant", [k.gate_up_swap, k.output_scale_2pct])
def test_a_mutant_fails_and_replays(mutant):
    r = moecheck.gate(mutant, cases=30, seed=1, quiet=True)
    assert not r.ok and len(r.failures) >= 5, r.text()
    f = r.failures[0]
    assert f"case={f.index}" in f.replay and "make-case" in f.make_case
    assert run_cli("compare", f.case_path, "--output", "python", "-q", check=False).returncode == 1
    again = moecheck.gate(mutant, seed=1, case=f.index, quiet=True)
    assert again.cases == 1 and len(again.failures) == 1, "the replay runs the same case alone"
    assert moecheck.gate(k.correct, seed=1, case=f.index, quiet=True).ok


def test_a_non_finite_output_is_a_failure_with_its_reason():
    r = moecheck.gate(k.nan_in_last_row, cases=2, seed=1, quiet=True)
    assert len(r.failures) == 2 and "max ratio inf" in r.failures[0].reason, r.text()


def test_what_the_callable_does_wrong_is_its_failure():
    def raises(case):
        raise RuntimeError("kernel exploded")

    def wrong_shape(case):
        return k.correct(case)[0][:1]

    r = moecheck.gate(raises, cases=2, seed=1, quiet=True)
    assert len(r.failures) == 2 and "RuntimeError: kernel exploded" in r.failures[0].reason
    r = moecheck.gate(wrong_shape, cases=1, seed=1, budget_model="fp32", quiet=True)
    assert len(r.failures) == 1 and "malformed" in r.failures[0].reason
    with pytest.raises(TypeError):
        moecheck.gate("not callable", cases=1)


def test_a_declined_case_is_counted_not_judged(tmp_path):
    r = moecheck.gate(k.at_most_8_tokens, cases=12, seed=1, quiet=True)
    assert r.ok and r.unsupported > 0 and r.passed > 0, r.text()
    assert r.passed + r.vacuous + r.unsupported == 12 and not r.failures
    assert r.unsupported_reasons == {"this kernel takes at most 8 tokens": r.unsupported}
    assert "unsupported by the backend (not judged)" in r.text()

    def declines_all(case):
        raise moecheck.Unsupported("routing not implemented")

    none = moecheck.gate(declines_all, cases=3, seed=1, quiet=True)
    assert not none.ok and none.judged_nothing and not none.failures, none.text()
    assert "no case was judged" in none.text()


def test_the_exec_shim_exits_77_for_a_declined_case(tmp_path):
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    path = tmp_path / "c.h5"
    run_cli("make-case", "--preset", "tiny-deepseek", "--tokens", "12", "--seed", "2", "-o", str(path))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(os.path.abspath(p) for p in sys.path if p))
    r = subprocess.run([sys.executable, "-m", "moecheck.exec_shim", "kernels_for_tests:at_most_8_tokens", str(path),
                        str(tmp_path / "out.h5")], capture_output=True, text=True, env=env)
    assert r.returncode == 77 and "this kernel takes at most 8 tokens" in r.stderr, r.stderr
    assert not (tmp_path / "out.h5").exists()
    # the binary reads it the same way: `run` exits 2 naming the reason, nothing recorded
    cli = run_cli("run", str(path), "--backend", f"exec:{sys.executable} -m moecheck.exec_shim "
                  "kernels_for_tests:at_most_8_tokens {case} {out}", check=False, env=env)
    assert cli.returncode == 2 and "declines this case (exit status 77)" in cli.stderr, cli.stderr


def test_shrink_through_the_callable(tmp_path):
    r = moecheck.gate(k.gate_up_swap, cases=30, seed=1, quiet=True, save_dir=tmp_path)
    big = max(r.failures, key=lambda f: moecheck.Case.load(f.case_path).tokens)
    tokens = moecheck.Case.load(big.case_path).tokens
    out = tmp_path / "min.h5"
    moecheck.shrink(big.case_path, k.gate_up_swap, out, control=k.correct, max_attempts=40, quiet=True)
    small = moecheck.Case.load(out)
    assert small.tokens <= tokens
    assert os.path.exists(out)
    # the minimal case still fails through the mutant and passes through the correct kernel
    # (judged as the shrinker judged it: output, ids, weights and the per-slot outputs)
    names = ("output", "topk_ids", "topk_weights", "expert_outputs")
    assert not moecheck.judge(small, budget_model="fp32", **dict(zip(names, k.gate_up_swap(small)))).passed
    assert moecheck.judge(small, budget_model="fp32", **dict(zip(names, k.correct(small)))).passed


def test_shrink_needs_an_importable_callable(tmp_path):
    with pytest.raises(ValueError, match="cannot be imported"):
        moecheck.shrink(tmp_path / "x.h5", lambda c: None, tmp_path / "y.h5")


def test_shrink_checks_the_spec_first(tmp_path):
    with pytest.raises(ValueError, match="cannot be imported by a subprocess"):
        moecheck.shrink(tmp_path / "x.h5", "no_such_module_here:kernel", tmp_path / "y.h5")


def test_recipe_pins_every_case(tmp_path):
    seen = []

    def spy(case):
        seen.append(case.layer_config())
        return k.correct(case)
    spy.budget_model = "fp32"
    r = moecheck.gate(spy, cases=12, seed=3, presets=["tiny-deepseek", "tiny-kimi"], recipe="sglang", quiet=True)
    assert r.ok, r.text()
    assert len(seen) == 12
    assert all(c["intermediate_dtype"] == "bf16" and c["combine"] == "bf16_slots" for c in seen)
    assert {c["routing"] for c in seen} == {"deepseek_v3"}
    # the CLI's gate draws the same cases under the same recipe
    r = run_cli("gate", "--backend", "emulated", "--cases", 12, "--seed", 3, "--presets", "tiny-deepseek,tiny-kimi",
                "--recipe", "sglang", "--no-golden", "-q", "-v", check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("--intermediate-dtype bf16") == 12 and r.stdout.count("--recipe combine=bf16_slots") == 12, r.stdout
    with pytest.raises(moecheck.InputError, match="recipe"):
        moecheck.gate(spy, cases=1, recipe="no-such-recipe", quiet=True)
