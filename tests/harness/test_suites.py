"""Suites: the shipped ones load and validate; bad suites are one-line BadInput errors."""

from __future__ import annotations

import pytest

from deltabench.harness.errors import BadInput
from deltabench.harness.suites import load_suite, parse_suite, shipped_suites

GOOD = {
    "name": "mine",
    "shapes": ["B=1,T=20,H=1,K=8,V=8"],
    "dtypes": ["fp32", "bfloat16"],
    "modes": ["fwd", "fwd+bwd"],
    "ops": {
        "gdn": {"impls": ["torch_recurrent", "torch_chunk"], "baseline": "torch_recurrent"},
        "kda": {"impls": ["torch_chunk"], "shapes": [{"B": 2, "T": 9, "H": 1, "K": 4}], "modes": ["bwd"]},
    },
}


def test_shipped_suites_load_and_validate():
    assert {"smoke", "train", "gdn2-gpu", "kda-gpu"} <= set(shipped_suites())
    for name in shipped_suites():
        suite = load_suite(name)
        assert suite.ops and all(p.baseline in p.impls for p in suite.ops)
    smoke = load_suite("smoke")
    assert smoke.device == "cpu"
    assert {p.op for p in smoke.ops} == {"gdn", "gdn2", "kda"}
    jobs = smoke.jobs(device="cpu")
    assert {c.dtype for c, _ in jobs} == {"fp32", "bf16"} and {c.mode for c, _ in jobs} == {"fwd", "fwd+bwd"}
    # its own choice, for a first run under 2 minutes (smoke.toml says why): no Triton impls, no jax_scan
    assert {impl for _, impl in jobs} == {"torch_recurrent", "torch_chunk", "jax_chunk"}
    train = load_suite("train")
    assert train.baselines == {"gdn": "fla_chunk"}
    assert {"fla_chunk", "flash_qla", "triton_chunk"} <= set(train.ops[0].impls)
    assert {tuple(d.values()) for d in train.ops[0].shapes} >= {(8, 4096, 6, 128, 128), (1, 32768, 16, 128, 128)}
    gdn2_gpu = load_suite("gdn2-gpu")  # deltabench's JAX kernels timed beside FLA's on the GPU
    assert {"fla_chunk", "jax_chunk", "pallas_gpu_chunk"} <= set(gdn2_gpu.ops[0].impls)


def test_gdn2_tpu_suites_cover_atomic_ops_table():
    suite = load_suite("gdn2-tpu")
    jobs = suite.jobs(device="cpu")
    assert {(c.B, c.T, c.H, c.K, c.V) for c, _ in jobs} == {
        (1, 1024, 6, 128, 128),
        (4, 2048, 6, 128, 128),
        (4, 4096, 6, 128, 128),
        (8, 4096, 6, 128, 128),
    }
    assert {c.dtype for c, _ in jobs} == {"fp32", "bf16"} and {c.mode for c, _ in jobs} == {"fwd", "bwd", "fwd+bwd"}
    impls = {"pallas_chunk", "atomic_ops_fused", "atomic_ops_wy", "jax_chunk", "jax_scan"}
    assert set(suite.ops[0].impls) == impls and suite.baselines == {"gdn2": "jax_scan"}
    small = load_suite("gdn2-tpu-cpu")
    assert small.device == "cpu" and set(small.ops[0].impls) == impls


def test_jobs_expand_in_order_with_defaults_and_overrides():
    suite = parse_suite(GOOD)
    jobs = suite.jobs(device="cpu")
    assert len(jobs) == 1 * 2 * 2 * 2 + 1 * 2 * 1 * 1
    first, second = jobs[0], jobs[1]
    assert (first[0].op, first[0].dtype, first[0].mode, first[1]) == ("gdn", "fp32", "fwd", "torch_recurrent")
    assert second[1] == "torch_chunk" and second[0] == first[0]
    kda = [c for c, _ in jobs if c.op == "kda"]
    assert kda[0].dims == {"B": 2, "T": 9, "H": 1, "K": 4, "V": 4} and kda[0].mode == "bwd"
    assert suite.baselines == {"gdn": "torch_recurrent", "kda": "torch_chunk"}  # first impl by default
    only = suite.jobs(device="cpu", impls=["torch_chunk"], ops=["gdn"])
    assert {(c.op, i) for c, i in only} == {("gdn", "torch_chunk")}
    # impls named by the caller come in the caller's order, so that a run cut short has the first ones
    both = suite.jobs(device="cpu", impls=["torch_chunk", "torch_recurrent"], ops=["gdn"])
    assert [i for _, i in both[:2]] == ["torch_chunk", "torch_recurrent"] and both[0][0] == both[1][0]


def test_user_suite_by_path(tmp_path):
    path = tmp_path / "user.toml"
    path.write_text('shapes = ["B=1,T=8,H=1,K=4"]\n[ops.gdn2]\nimpls = ["torch_chunk"]\n')
    suite = load_suite(str(path))
    assert suite.name == "user" and suite.jobs(device="cpu")[0][0].V == 4


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"ops": {"nope": {"impls": ["x"]}}}, "unknown op 'nope'"),
        ({"ops": {"gdn": {"impls": ["not_an_impl"]}}}, "unknown impl 'not_an_impl' for op 'gdn'"),
        ({"shapes": ["B=1,T=0,H=1,K=8"]}, "T must be at least 1"),
        ({"shapes": ["B=1,T=8,H=1"]}, "lacks K"),
        ({"shapes": ["B=1;T=8"]}, "malformed shape"),
        ({"dtypes": ["fp64"]}, "unsupported dtype 'fp64'"),
        ({"modes": ["backward"]}, "unknown mode 'backward'"),
        ({"shapez": []}, "unknown key 'shapez'"),
        ({"ops": {"gdn": {"impls": ["torch_chunk"], "baseline": "torch_recurrent"}}}, "baseline 'torch_recurrent'"),
        ({"timing": {"budget_s": -1}}, "[timing] budget_s"),
        ({"gate": {"seedz": 2}}, "[gate] seedz"),
        ({"gate": {"regimes": ["stong"]}}, "op 'gdn' has no regime 'stong'"),
        ({"gate": {"regimes": []}}, "[gate] regimes"),
        ({"ops": {}}, "needs at least one [ops.<op>] table"),
        ({"device": "npu"}, "unknown device 'npu': use one of cpu, cuda, tpu"),
        ({"device": "cuda:1"}, "give a platform (cpu, cuda, tpu)"),
    ],
)
def test_bad_suites_are_bad_input(change, message):
    data = {**GOOD, **change}
    with pytest.raises(BadInput) as info:
        parse_suite(data, source="bad.toml")
    text = str(info.value)
    assert message in text and "bad.toml" in text and "\n" not in text


def test_unknown_suite_and_filters():
    with pytest.raises(BadInput, match=r"unknown suite 'nope'.*smoke"):
        load_suite("nope")
    with pytest.raises(BadInput, match="does not exist"):
        load_suite("/no/such/suite.toml")
    suite = parse_suite(GOOD)
    with pytest.raises(BadInput, match="no impl 'fla_chunk'"):
        suite.jobs(device="cpu", impls=["fla_chunk"])
    with pytest.raises(BadInput, match="no op 'gdn2'"):
        suite.jobs(device="cpu", ops=["gdn2"])


def test_invalid_toml_is_bad_input(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text("shapes = [\n")
    with pytest.raises(BadInput, match="invalid TOML"):
        load_suite(str(path))


def test_a_suite_runs_in_parts_by_shape_and_mode():
    # sdm-gpu whole takes more than a device session; its parts, one document each, merge into its table
    suite = load_suite("sdm-gpu")
    flagship_32k = "B=1,T=32768,H=2,S=65536,D=1024,W=64,R=64"
    jobs = suite.jobs(device="cuda", shapes=[flagship_32k], modes=["fwd+bwd"], impls=["triton_chunk"])
    assert [(c.op, c.T, c.mode, impl) for c, impl in jobs] == [("sdm", 32768, "fwd+bwd", "triton_chunk")]
    # a gdn shape read by gdn's dims (V defaulted to K), and only gdn's jobs at it; every mode when none is named
    jobs = suite.jobs(device="cuda", shapes=["B=1,T=8192,H=2,K=128"])
    assert {c.op for c, _ in jobs} == {"gdn"} and len(jobs) == 2 * 2  # two impls, two modes
    assert len(suite.jobs(device="cuda", modes=["fwd"])) == len(suite.jobs(device="cuda")) // 2
    with pytest.raises(BadInput, match=r"has no shape 'B=1,T=8192,H=2,K=64'.*B=1,T=32768"):
        suite.jobs(device="cuda", shapes=["B=1,T=8192,H=2,K=64"])
    with pytest.raises(BadInput, match="has no mode 'bwd'"):
        suite.jobs(device="cuda", modes=["bwd"])


def test_a_suite_records_its_source_without_this_machines_paths(tmp_path, monkeypatch):
    """A run's ``meta.suite_source`` names a shipped suite by its name and a user's by the path as given."""
    shipped = load_suite("smoke")
    assert shipped.source == "suites/smoke.toml (shipped)"
    assert "/" + "site-packages" not in shipped.source and not shipped.source.startswith("/")
    (tmp_path / "mine.toml").write_text('shapes = ["B=1,T=8,H=1,K=4"]\n[ops.gdn]\nimpls = ["torch_chunk"]\n')
    monkeypatch.chdir(tmp_path)
    assert load_suite("mine.toml").source == "mine.toml"


def test_every_shipped_suite_times_enough_samples_to_be_judged() -> None:
    """A job as slow as the suite's budget gets min_reps samples: the regression gate must be able to judge that
    many at its default alpha (smoke's torch_recurrent fwd+bwd got 3, always 'too few samples to judge')."""
    from deltabench.harness.suites import TimingSettings
    from deltabench.regression.rule import DEFAULT_ALPHA
    from deltabench.regression.samples import min_attainable_p

    for name in shipped_suites():
        n = TimingSettings(**load_suite(name).timing).min_reps
        assert min_attainable_p(n, n) < DEFAULT_ALPHA, f"suite {name}: min_reps = {n} cannot be judged"
