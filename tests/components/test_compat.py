"""Will this bundle break my index? The embedding space identity in the manifest and on the
server, `ortpack bundle diff`, and the admission policy (`--require`) of the server and of
`ortpack bundle verify`.

Bundles: `tiny_bundle` (the session's tiny BERT, fp32 and int8), a second build of the same
checkpoint, a checkpoint with other random weights (seed 1), and one of another width (32)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from ortpack.kernel.bundle import BundleError, embedding_space, read_manifest, space_id
from tests.cli import ortpack
from tests.models import build_tiny_bundle
from tests.servers import free_port, running_server

SPACE_ID = re.compile(r"^sha256:[0-9a-f]{16}$")


@pytest.fixture(scope="module")
def rebuilt(tiny_bert: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same checkpoint as `tiny_bundle`, exported and built again from scratch."""
    return build_tiny_bundle(tiny_bert, tmp_path_factory.mktemp("rebuilt") / "tiny-bert", ("fp32", "int8"))


@pytest.fixture(scope="module")
def reseeded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.models import make_tiny_bert

    root = tmp_path_factory.mktemp("reseeded")
    return build_tiny_bundle(make_tiny_bert(root / "model", seed=1), root / "tiny-bert", ("fp32",))


@pytest.fixture(scope="module")
def narrow(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.models import make_tiny_bert

    root = tmp_path_factory.mktemp("narrow")
    return build_tiny_bundle(make_tiny_bert(root / "model", hidden_size=32), root / "tiny-bert", ("fp32",))


def spaces(bundle: Path) -> dict[str, dict[str, object]]:
    """variant id -> the space recorded in manifest.json, as written."""
    raw = json.loads((bundle / "manifest.json").read_text())
    return {v["id"]: v["space"] for v in raw["variants"]}


def serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ortpack.serving", "--port", str(free_port()), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def one_error_line(result: subprocess.CompletedProcess[str], prefix: str) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith(prefix)]
    assert len(errors) == 1, result.stderr
    return errors[0]


# ---------------------------------------------------------------------------- the space identity


def test_each_variant_records_its_space(tiny_bundle: Path) -> None:
    manifest = read_manifest(tiny_bundle)
    recorded = spaces(tiny_bundle)
    for variant in manifest.variants:
        space = recorded[variant.id]
        assert SPACE_ID.match(str(space["id"]))
        assert space["model_sha256"] == manifest.files[variant.file].sha256
        assert space["tokenizer_sha256"] == manifest.files["tokenizer.json"].sha256
        assert space["weights_sha256"] == manifest.source.weights_sha256 is not None
        assert (space["precision"], space["pooling"], space["normalize"]) == (variant.precision, "mean", True)
        assert (space["dimensions"], space["max_length"]) == (64, manifest.task_settings.tokenizer.max_length)  # type: ignore[union-attr]
        # the id is the short sha256 of the other fields as canonical JSON: anyone can recompute it
        assert space["id"] == space_id({k: v for k, v in space.items() if k != "id"})
        assert embedding_space(manifest, variant) == variant.space
    fp32, int8 = recorded["cpu-fp32"], recorded["cpu-int8"]
    # same model, another precision: the same weights, another graph, another space
    assert fp32["weights_sha256"] == int8["weights_sha256"] and fp32["id"] != int8["id"]


@pytest.mark.slow
def test_the_space_follows_the_weights_not_the_build(tiny_bundle: Path, rebuilt: Path, reseeded: Path) -> None:
    assert spaces(rebuilt) == spaces(tiny_bundle)  # two builds of one checkpoint: the same spaces
    other = spaces(reseeded)["cpu-fp32"]
    assert other["id"] != spaces(tiny_bundle)["cpu-fp32"]["id"]
    assert other["weights_sha256"] != spaces(tiny_bundle)["cpu-fp32"]["weights_sha256"]


def test_a_bundle_without_spaces_gets_them_computed_on_load(tiny_bundle: Path, tmp_path: Path) -> None:
    """A bundle written before spaces were recorded (manifest.json is not in its own file list)."""
    old = tmp_path / "old"
    shutil.copytree(tiny_bundle, old)
    raw = json.loads((old / "manifest.json").read_text())
    for variant in raw["variants"]:
        del variant["space"]
    (old / "manifest.json").write_text(json.dumps(raw, indent=2))
    manifest = read_manifest(old)
    for variant in manifest.variants:
        assert variant.space is None
        space = embedding_space(manifest, variant)
        assert space is not None and space.id == spaces(tiny_bundle)[variant.id]["id"]
    verified = ortpack("bundle", "verify", str(old))
    assert verified.returncode == 0, verified.stderr
    assert f"space: cpu-fp32 {spaces(tiny_bundle)['cpu-fp32']['id']}" in verified.stdout


def test_a_space_id_that_does_not_match_its_fields_is_refused(tiny_bundle: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(tiny_bundle, bad)
    raw = json.loads((bad / "manifest.json").read_text())
    raw["variants"][0]["space"]["dimensions"] = 65
    (bad / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(BundleError, match=r"invalid manifest.json .*space.*does not match its fields"):
        read_manifest(bad)


# ---------------------------------------------------------------------------- bundle diff


def test_the_same_model_is_a_drop_in(tiny_bundle: Path, rebuilt: Path) -> None:
    """Two builds of one checkpoint: the same spaces, so each is embedded once and the numbers are
    exact (test_the_command_exits_with_its_verdict compares across precisions, where they are not)."""
    from ortpack.components.core.compat import diff_bundles

    result = diff_bundles(str(tiny_bundle), str(rebuilt))
    assert result.verdict == "drop-in" and result.exit_code == 0
    assert [(p.old, p.new) for p in result.pairs] == [("cpu-fp32", "cpu-fp32"), ("cpu-int8", "cpu-int8")]
    assert result.texts["queries"] == 400 and result.texts["documents"] > 500 and result.texts["probe"] > 10
    for pair in result.pairs:
        assert pair.same_space
        assert pair.probe["min_cosine"] > 0.9999 and pair.retrieval["min_cosine"] > 0.9999
        assert pair.probe["neighbour_agreement"] == pair.retrieval["neighbour_agreement"] == 1.0
        assert pair.retrieval["recall_old"] == pair.retrieval["recall_cross"] == pair.retrieval["recall_ratio"] == 1.0


def test_other_weights_need_a_new_index(tiny_bundle: Path, reseeded: Path) -> None:
    from ortpack.components.core.compat import diff_bundles

    result = diff_bundles(str(tiny_bundle), str(reseeded))
    assert result.verdict == "re-index" and result.exit_code == 3
    (pair,) = result.pairs  # only fp32 is in both
    assert (pair.old, pair.new, pair.same_space) == ("cpu-fp32", "cpu-fp32", False)
    numbers = pair.retrieval
    assert numbers["recall_old"] == 1.0 and numbers["recall_ratio"] == numbers["recall_cross"] < 0.5
    assert numbers["mean_cosine"] < 0.9 and numbers["neighbour_agreement"] < 0.9
    assert "below the 0.95 budget" in pair.reason
    # a budget the cross-space recall reaches turns the same numbers into a drop-in
    from ortpack.components.core.compat import DiffSpec

    lenient = diff_bundles(str(tiny_bundle), str(reseeded), DiffSpec(budget=max(numbers["recall_ratio"], 0.001)))
    assert lenient.verdict == "drop-in"


def test_another_width_is_incompatible_without_running_anything(tiny_bundle: Path, narrow: Path) -> None:
    from ortpack.components.core.compat import diff_bundles

    result = diff_bundles(str(tiny_bundle), str(narrow))
    assert result.verdict == "incompatible" and result.exit_code == 4
    (pair,) = result.pairs
    assert pair.dimensions == (64, 32) and pair.reason == "dimensions differ: 64 -> 32"
    assert pair.probe == {} and pair.retrieval == {}


@pytest.mark.slow
def test_the_command_exits_with_its_verdict(tiny_bundle: Path, rebuilt: Path, reseeded: Path, narrow: Path) -> None:
    same = ortpack("bundle", "diff", str(tiny_bundle), str(rebuilt / "manifest.json"))
    assert same.returncode == 0, same.stderr
    lines = same.stdout.splitlines()
    assert lines[-1].startswith("verdict: drop-in: ")
    assert any(line.startswith("cpu-int8 -> cpu-int8  same") and line.endswith("drop-in") for line in lines)

    other = ortpack("bundle", "diff", str(tiny_bundle), str(reseeded), "--json")
    assert other.returncode == 3, other.stderr
    report = json.loads(other.stdout)
    assert report["verdict"] == "re-index" and report["exit_code"] == 3 and report["budget"] == 0.95
    assert report["old"]["spaces"] == {v: s["id"] for v, s in spaces(tiny_bundle).items()}
    (pair,) = report["pairs"]
    assert pair["same_space"] is False and pair["retrieval"]["recall_ratio"] < 0.95

    wide = ortpack("bundle", "diff", str(tiny_bundle), str(narrow))
    assert wide.returncode == 4, wide.stderr
    assert wide.stdout.splitlines()[-1] == "verdict: incompatible: cpu-fp32 -> cpu-fp32: dimensions differ: 64 -> 32"

    every = ortpack("bundle", "diff", str(tiny_bundle), str(rebuilt), "--all-pairs", "--json")
    assert every.returncode in (0, 3), every.stderr  # fp32 against int8 may miss the budget
    pairs = {(p["old"], p["new"]): p for p in json.loads(every.stdout)["pairs"]}
    assert len(pairs) == 4
    # another precision of the same weights: another space, close vectors (the int8 gate held them
    # to a mean cosine of 0.98 against PyTorch), most of the old top-10 found
    cross = pairs[("cpu-fp32", "cpu-int8")]
    assert cross["same_space"] is False and cross["retrieval"]["mean_cosine"] > 0.97
    assert 0.5 < cross["retrieval"]["recall_ratio"] <= 1.0


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["{old}", "{tmp}/none"], "bundle directory not found"),
        (["{old}", "{old}", "--budget", "1.5"], "--budget must be in (0, 1]"),
        (["{old}", "file:///no/such/bundle.tar"], "/no/such/bundle.tar"),
        (["{old}", "{old}", "--queries", "{tmp}/none.txt"], "cannot read texts from"),
    ],
)
def test_the_command_refuses_bad_input_with_exit_2(
    args: list[str], fragment: str, tiny_bundle: Path, tmp_path: Path
) -> None:
    args = [a.replace("{old}", str(tiny_bundle)).replace("{tmp}", str(tmp_path)) for a in args]
    result = ortpack("bundle", "diff", *args)
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert fragment in one_error_line(result, "ortpack: error:")


def test_own_queries_and_documents(tiny_bundle: Path, tmp_path: Path) -> None:
    from ortpack.components.core.compat import DiffSpec, diff_bundles, read_texts

    (tmp_path / "q.jsonl").write_text('"where is my parcel"\n\n"reset my password"\n')
    (tmp_path / "d.txt").write_text("Parcels arrive in three days.\nPasswords are reset by email.\nHello.\n")
    spec = DiffSpec(queries=read_texts(tmp_path / "q.jsonl"), documents=read_texts(tmp_path / "d.txt"))
    assert spec.queries == ("where is my parcel", "reset my password") and len(spec.documents) == 3
    result = diff_bundles(str(tiny_bundle), str(tiny_bundle), spec)
    assert result.texts["queries"] == 2 and result.texts["documents"] == 3 and result.verdict == "drop-in"


# ---------------------------------------------------------------------------- the policy


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("int8.min_cosine>=0.95", ("int8", "min_cosine", ">=", 0.95)),
        (" cpu-fp32.b1.max_abs_diff <= 1e-4 ", ("cpu-fp32", "b1.max_abs_diff", "<=", 1e-4)),
        ("fp32.neighbour_agreement==1", ("fp32", "neighbour_agreement", "==", 1.0)),
        ("space=sha256:0123456789abcdef", ("", "space", "==", "sha256:0123456789abcdef")),
    ],
)
def test_policy_expressions_parse(text: str, parsed: tuple[object, ...]) -> None:
    from ortpack.kernel.policy import parse_requirement

    r = parse_requirement(text)
    assert (r.selector, r.metric, r.op, r.value) == parsed


@pytest.mark.parametrize(
    "text", ["int8.min_cosine=>0.9", "min_cosine>=0.9", "int8.min_cosine>=high", "space=0123", "int8.>=1"]
)
def test_malformed_policy_expressions_are_refused(text: str) -> None:
    from ortpack.kernel.policy import PolicyError, parse_requirement

    with pytest.raises(PolicyError, match="--require"):
        parse_requirement(text)


def test_the_policy_option_comes_from_flags_or_the_environment() -> None:
    from ortpack.serving.config import ConfigError, parse_config

    env = {"ORTPACK_REQUIRE": "int8.min_cosine>=0.9; ;fp32.min_cosine>=0.99"}
    assert parse_config(["--bundle", "b"], env).require == ("int8.min_cosine>=0.9", "fp32.min_cosine>=0.99")
    flags = ["--bundle", "b", "--require", "int8.min_cosine>=0.5", "--require", "space=sha256:0123456789abcdef"]
    assert parse_config(flags, env).require == ("int8.min_cosine>=0.5", "space=sha256:0123456789abcdef")
    with pytest.raises(ConfigError, match="is not VARIANT_OR_PRECISION.METRIC OP NUMBER"):
        parse_config(["--bundle", "b", "--require", "int8.min_cosine"], {})


def test_the_server_exposes_the_space_and_applies_a_policy(tiny_bundle: Path, tmp_path: Path) -> None:
    """A policy that pins the fp32 space: the server serves cpu-fp32 (int8 is another space) and says
    so; its metadata, front door and every embeddings answer name the space."""
    manifest = read_manifest(tiny_bundle)
    fp32 = embedding_space(manifest, manifest.variant("cpu-fp32"))
    assert fp32 is not None
    policy = ["--require", f"space={fp32.id}", "--require", "fp32.min_cosine>=0.999"]
    with running_server(tiny_bundle, *policy, log_dir=tmp_path) as s:
        meta = httpx.get(f"{s.url}/v2/models/tiny-bert").json()["parameters"]
        front = httpx.get(f"{s.url}/").json()
        openai = httpx.post(f"{s.url}/v1/embeddings", json={"input": ["a sentence"]})
        v2 = httpx.post(
            f"{s.url}/v2/models/tiny-bert/infer",
            json={"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a sentence"]}]},
        )
        error = httpx.post(f"{s.url}/v1/embeddings", json={"input": ""})
    assert meta["variant"] == "cpu-fp32"
    assert meta["embedding_space"] == fp32.model_dump() == front["embedding_space"]
    assert meta["policy"]["require"] == [f"space={fp32.id}", "fp32.min_cosine>=0.999"]
    (miss,) = meta["policy"]["excluded"]["cpu-int8"]
    assert miss.startswith(f"'space={fp32.id}': cpu-int8 serves space sha256:")
    assert openai.status_code == 200 and openai.headers["x-embedding-space"] == fp32.id
    assert v2.status_code == 200 and v2.headers["x-embedding-space"] == fp32.id
    assert error.status_code == 400 and "x-embedding-space" not in error.headers
    assert "policy: variant cpu-int8 is not served" in s.output()


def test_the_server_refuses_a_bundle_that_misses_the_policy_before_loading(tiny_bundle: Path) -> None:
    values = read_manifest(tiny_bundle).variant("cpu-int8").parity.values
    flags = serve("--bundle", str(tiny_bundle), "--require", "int8.min_cosine>=1.5", "--variant", "cpu-int8")
    assert flags.returncode == 2
    line = one_error_line(flags, "ortpack-serve: error:")
    assert line == (
        "ortpack-serve: error: bundle tiny-bert 1 refused by policy: no variant meets it: "
        f"'int8.min_cosine>=1.5': cpu-int8 recorded min_cosine {values['min_cosine']:.6g}"
    )
    assert "loaded tiny-bert" not in flags.stderr and "node check" not in flags.stderr
    env = {"ORTPACK_REQUIRE": "int8.min_cosine>=1.5;fp32.neighbour_agreement>1"}
    from_env = serve("--bundle", str(tiny_bundle), env=env)
    assert from_env.returncode == 2
    line = one_error_line(from_env, "ortpack-serve: error:")
    assert "'int8.min_cosine>=1.5': cpu-int8 recorded" in line
    assert "'fp32.neighbour_agreement>1': cpu-fp32 recorded neighbour_agreement 1" in line
    typo = serve("--bundle", str(tiny_bundle), "--require", "in8.min_cosine>=0.9")
    assert typo.returncode == 2 and "names 'in8', neither a precision" in one_error_line(typo, "ortpack-serve: error:")
    malformed = serve("--bundle", str(tiny_bundle), "--require", "int8.min_cosine")
    assert malformed.returncode == 2
    assert one_error_line(malformed, "ortpack-serve: error:").endswith("(see ortpack-serve --help)")


def test_bundle_verify_applies_the_policy(tiny_bundle: Path) -> None:
    int8 = read_manifest(tiny_bundle).variant("cpu-int8").parity.values["min_cosine"]
    ok = ortpack("bundle", "verify", str(tiny_bundle), "--require", "fp32.min_cosine>=0.999")
    assert ok.returncode == 0, ok.stderr
    assert "policy: 1 requirement met by cpu-fp32, cpu-int8" in ok.stdout
    partial = ortpack("bundle", "verify", str(tiny_bundle), "--require", "int8.min_cosine>=1.5")
    assert partial.returncode == 0, partial.stderr
    assert f"policy: cpu-int8 would not be served: 'int8.min_cosine>=1.5': cpu-int8 recorded min_cosine {int8:.6g}" in (
        partial.stdout
    )
    refused = ortpack("bundle", "verify", str(tiny_bundle), env={"ORTPACK_REQUIRE": "int8.min_cosine>=1.5;fp32.x<1"})
    assert refused.returncode == 2
    line = one_error_line(refused, "ortpack: error:")
    assert "refused by policy: no variant meets it" in line and "cpu-fp32 records no x (it records: " in line
    malformed = ortpack("bundle", "verify", str(tiny_bundle), "--require", "int8.min_cosine=>0.9")
    assert malformed.returncode == 2
    assert "is not VARIANT_OR_PRECISION.METRIC OP NUMBER" in one_error_line(malformed, "ortpack: error:")
