"""adopt: a live command line and environment read back into a profile, and compare's proof (issue 42).

The property: render a profile, read its argv and environment as the host reads a hand-started
server's (the API key on argv, redacted), adopt it, and get the same profile back, for each shipped
SGLang version; compare finds no difference that changes what the server does.
"""

from __future__ import annotations

import hashlib
import shlex
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from orchestrator.errors import ProfileError
from orchestrator.profile import sglang_flags, sglang_rules
from orchestrator.profile.model import Profile, validate
from orchestrator.render import launch, reverse
from orchestrator.render.reverse import SECRET, Live, adopt, compare

#: The settings a multi-node deployment writes per rank; adopt takes one-host servers only.
NODE_SETTINGS = {"nnodes", "node_rank", "dist_init_addr"}
SHA = hashlib.sha256(b"the key itself").hexdigest()
SHELL = {"PWD": "/root", "SHLVL": "1", "SSH_CONNECTION": "10.0.0.9 51000 10.0.0.1 22", "TERM": "xterm"}


def live_of(profile: Profile, plan: launch.Plan) -> Live:
    """What the host reads of a server started by hand with the plan's argv and environment: the API
    key on argv (redacted), secret variables redacted, and what the login and systemd's User= set."""
    argv = plan.started_argv()
    if plan.credential_at is not None:
        argv[plan.credential_at - 1 : plan.credential_at + 1] = ["--api-key", SECRET]
    user = profile.service.user
    home = "/root" if user == "root" else f"/home/{user}"
    env = {"HOME": home, "USER": user, "LOGNAME": user, "SHELL": "/bin/bash"}
    env |= {"PATH": reverse.SYSTEMD_PATHS[0], "INVOCATION_ID": "0" * 32, **SHELL}
    env |= plan.environment | dict.fromkeys(profile.secret_env, SECRET)
    secrets = dict.fromkeys(profile.secret_env, SHA) | ({"--api-key": SHA} if profile.api_key else {})
    return Live(
        argv=argv,
        env=env,
        secrets=secrets,
        python=argv[0],
        cwd=profile.service.working_directory,
        user=user,
        entry="module",
        host="gpu1",
        pid=4242,
        passwd_home=home,
        passwd_shell="/bin/bash",
        adaptive_config=plan.adaptive_config,
    )


def fields(profile: Profile) -> dict[str, Any]:
    """What a profile makes the server do: every field but its name, its words and where its
    secrets are read from on the control machine."""
    dumped = profile.model_dump(exclude={"name", "description", "api_key", "secret_env"})
    return dumped | {"api_key": profile.api_key is not None, "secret_env": sorted(profile.secret_env)}


def round_trip(profile: Profile) -> tuple[Profile, Live, reverse.Adoption]:
    live = live_of(profile, launch.build(profile))
    adoption = adopt(live, name=profile.name, version=profile.server.sglang_version)
    assert adoption.problems == []
    assert adoption.profile is not None
    return adoption.profile, live, adoption


def changing(differences: list[reverse.Difference]) -> list[reverse.Difference]:
    return [d for d in differences if not d.harmless]


def rendered_settings(argv: list[str], version: str) -> set[str]:
    """The MODELLED settings whose flags an argv holds, as SGLang's argparse reads it."""
    names = {n for arg in sglang_flags.read_args(version, argv[3:]) if arg.option for n in arg.option.names}
    return {s for s in sglang_flags.MODELLED if sglang_flags.flag(s, version) in names}


# --- profiles over every field the renderer writes a flag or a variable for -----------------

TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc", "Cn", "Co")), max_size=8)
PATHS = TEXT.map(lambda t: f"/data/{t}")
PYTHONS = ["/usr/bin/python3", "/opt/venv/bin/python", "/opt/sglang env/bin/python3.11"]
HOSTS = ["127.0.0.1", "0.0.0.0", "::", "::1", "10.1.2.3", "gpu1.example.com"]
NCCL = {
    "NCCL_PROTO": ["LL", "LL128", "Simple"],
    "NCCL_ALGO": ["Ring", "Tree"],
    "NCCL_P2P_LEVEL": ["SYS", "NVL"],
    "NCCL_MIN_NCHANNELS": ["16", "4"],
    "NCCL_BUFFSIZE": ["16777216"],
    "NCCL_NTHREADS": ["512", "256"],
    "NCCL_DEBUG": ["WARN"],
}
ENV_NAMES = [
    "LANG",
    "OMP_NUM_THREADS",
    "HF_HOME",
    "LD_PRELOAD",
    "PYTHONUNBUFFERED",
    "TRITON_CACHE_DIR",
    "PATH",
    "HOME",
]
#: Unmodelled flags of every shipped version, each in the forms a team writes it: a prefix, `=`,
#: a negative value, JSON, several values.
EXTRA = {
    "--max-running-requests": [["--max-running-requests", "8"], ["--max-running=16"]],
    "--chunked-prefill-size": [["--chunked-prefill-size", "4096"]],
    "--disable-radix-cache": [["--disable-radix-cache"]],
    "--schedule-policy": [["--schedule-policy", "fcfs"], ["--schedule-pol=lpm"]],
    "--watchdog-timeout": [["--watchdog-timeout", "300.50"]],
    "--random-seed": [["--random-seed", "-3"]],
    "--json-model-override-args": [["--json-model-override-args", '{"rope_scaling": null}']],
    "--lora-paths": [["--lora-paths", "a", "b c"]],
    "--log-requests": [["--log-requests"]],
}


@st.composite
def env_values(draw: st.DrawFn, name: str) -> str:
    value = draw(PATHS if name in ("HOME", "PATH") else TEXT)
    assume(value != SECRET and value not in reverse.SYSTEMD_PATHS and value not in ("/root", "/home/sglang"))
    assume(not (name == "PYTHONUNBUFFERED" and value == "1"))  # the unit's own: adopt leaves it to the unit
    return value


@st.composite
def adaptive(draw: st.DrawFn) -> dict[str, Any]:
    """speculative.adaptive and the trio as SGLang 0.5.23 takes them with it (sglang_rules.check_adaptive)."""
    tiers = draw(
        st.none()
        | st.dictionaries(
            st.integers(1, 64),
            st.lists(st.integers(0, 8), min_size=1, max_size=4, unique=True).map(sorted),
            min_size=1,
            max_size=3,
        )
    )
    knobs = {
        "ema_alpha": st.floats(0.01, 1),
        "update_interval": st.integers(1, 100),
        "warmup_batches": st.integers(0, 100),
        "down_hysteresis": st.floats(-1, 1),
        "up_hysteresis": st.floats(-1, 1),
        "ceiling_coeff": st.floats(0, 10),
    }
    chosen = {k: draw(s) for k, s in knobs.items() if tiers is not None and draw(st.booleans())}
    out: dict[str, Any] = {"adaptive": {} if tiers is None else {"tiers": tiers, **chosen}}
    steps = draw(
        st.none() | st.sampled_from([c for c in sglang_rules.adaptive_candidates(tiers) if c >= 1] or [1])
    )
    if steps is not None:
        out["num_steps"] = steps
    if draw(st.booleans()):
        out["eagle_topk"] = 1
    if draw(st.booleans()):
        out["num_draft_tokens"] = sglang_rules.adaptive_start_steps(tiers, steps) + 1
    return out


@st.composite
def speculative(draw: st.DrawFn, version: str) -> dict[str, Any]:
    algorithm = draw(st.sampled_from([None, "EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"]))
    if algorithm is None or algorithm == "NGRAM":  # NGRAM drafts from the context: nothing else
        return {"algorithm": algorithm} if algorithm else {}
    spec: dict[str, Any] = {"algorithm": algorithm, "draft_model_path": draw(PATHS)}
    can_adapt = (
        sglang_flags.flag("speculative_adaptive", version) and algorithm in sglang_rules.ADAPTIVE_ALGORITHMS
    )
    if can_adapt and draw(st.booleans()):
        return spec | draw(adaptive())
    if draw(st.booleans()):
        steps, topk = draw(st.integers(1, 8)), draw(st.integers(1, 8))
        draft = steps + 1 if topk == 1 else draw(st.integers(1, min(steps * topk + 1, 256)))
        spec |= {"num_steps": steps, "eagle_topk": topk, "num_draft_tokens": draft}
    return spec


@st.composite
def server(draw: st.DrawFn, version: str) -> dict[str, Any]:
    out: dict[str, Any] = {"sglang_version": version, "python": draw(st.sampled_from(PYTHONS))}
    out |= {"model_path": draw(PATHS), "tp_size": draw(st.integers(1, 8)), "dp_size": draw(st.integers(1, 2))}
    optional = {
        "served_model_name": TEXT.filter(
            lambda t: t not in ("", "--")
        ),  # "-x" renders --served-model-name=-x
        "host": st.sampled_from(HOSTS),
        "port": st.integers(1, 65535),
        "mem_fraction_static": st.floats(0.01, 0.99),
        "context_length": st.integers(1, 2**31 - 1),
        "trust_remote_code": st.booleans(),
        "cuda_graph": st.booleans(),
        "log_level": st.sampled_from(["debug", "info", "warning", "error", "critical"]),
        "enable_metrics": st.booleans(),
    }
    out |= {key: draw(strategy) for key, strategy in optional.items() if draw(st.booleans())}
    if out.get("cuda_graph", True) and draw(st.booleans()):
        out["cuda_graph_max_bs"] = draw(st.integers(1, 1024))
    flags = draw(st.lists(st.sampled_from(sorted(EXTRA)), unique=True, max_size=3))
    out["extra_args"] = [word for flag in flags for word in draw(st.sampled_from(EXTRA[flag]))]
    if draw(st.booleans()):
        count = out["tp_size"] * out["dp_size"]
        out["gpus"] = draw(st.lists(st.integers(0, 63), unique=True, min_size=count, max_size=count))
    return out


@st.composite
def profiles(draw: st.DrawFn, version: str) -> dict[str, Any]:
    nccl = draw(st.lists(st.sampled_from(sorted(NCCL)), unique=True, max_size=4))
    env = draw(st.lists(st.sampled_from(ENV_NAMES), unique=True, max_size=3))
    data: dict[str, Any] = {
        "name": "adopted",
        "server": draw(server(version)),
        "speculative": draw(speculative(version)),
        "nccl": {name: draw(st.sampled_from(NCCL[name])) for name in nccl},
        "env": {name: draw(env_values(name)) for name in env},
        "service": {
            "user": draw(st.sampled_from(["root", "sglang"])),
            "working_directory": draw(st.sampled_from(["/", "/srv/sglang", "/data/run dir"])),
            "compile_cache": draw(st.booleans()),
        },
    }
    if draw(st.booleans()):
        data["api_key"] = {"file": "secrets/key"}
    if draw(st.booleans()):
        data["secret_env"] = {"HF_TOKEN": {"file": "secrets/hf"}}
    return data


@pytest.mark.parametrize("version", sglang_flags.SHIPPED)
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]
)
@given(data=st.data())
def test_render_then_adopt_gives_back_the_profile(version: str, data: st.DataObject) -> None:
    try:
        original = validate(data.draw(profiles(version)))
        launch.build(original)
    except ProfileError:
        assume(False)
        raise
    adopted, live, adoption = round_trip(original)
    assert fields(adopted) == fields(original)
    assert changing(compare(adopted, live, version)) == []
    assert SECRET not in yaml.safe_dump(adoption.data) and SHA not in yaml.safe_dump(adoption.data)


# --- every modelled setting has its way back --------------------------------------------------


def test_every_modelled_setting_has_a_reverse_mapping() -> None:
    assert set(reverse.FIELDS).isdisjoint(reverse.APART)
    assert set(reverse.FIELDS) | set(reverse.APART) == set(sglang_flags.MODELLED)


def _full(version: str) -> list[dict[str, Any]]:
    """Profiles that together set every modelled setting `version` has (but the node flags)."""
    first = {
        "name": "full",
        "server": {
            "sglang_version": version,
            "model_path": "/data/models/m",
            "served_model_name": "m",
            "tp_size": 4,
            "dp_size": 2,
            "host": "0.0.0.0",
            "port": 30001,
            "mem_fraction_static": 0.8,
            "context_length": 8192,
            "trust_remote_code": True,
            "cuda_graph_max_bs": 16,
            "log_level": "info",
            "enable_metrics": True,
        },
        "speculative": {
            "algorithm": "EAGLE3",
            "draft_model_path": "/data/draft",
            "num_steps": 3,
            "eagle_topk": 4,
            "num_draft_tokens": 5,
        },
        "api_key": {"file": "secrets/key"},
    }
    second = {
        "name": "full",
        "server": {"sglang_version": version, "model_path": "/m", "cuda_graph": False, "host": "::"},
        "disaggregation": {
            "mode": "prefill",
            "transfer_backend": "nixl",
            "bootstrap_port": 9000,
            "ib_device": "mlx5_0",
        },
    }
    if sglang_flags.flag("speculative_adaptive", version):
        tiers = {"tiers": {1: [1, 3], 8: [0, 1]}, "ema_alpha": 0.3}
        second["speculative"] = {"algorithm": "EAGLE", "draft_model_path": "/d", "adaptive": tiers}
    return [first, second]


@pytest.mark.parametrize("version", sglang_flags.SHIPPED)
def test_every_modelled_setting_is_rendered_and_read_back(version: str) -> None:
    """A setting added to MODELLED without its way back fails here: these profiles must render
    every flag the version has, and each comes back to its field."""
    wanted = {s for s in sglang_flags.MODELLED if sglang_flags.flag(s, version)} - NODE_SETTINGS
    covered: set[str] = set()
    for data in _full(version):
        original = validate(data)
        covered |= rendered_settings(launch.build(original).argv, version)
        adopted, live, _ = round_trip(original)
        assert fields(adopted) == fields(original)
        assert changing(compare(adopted, live, version)) == []
    assert covered == wanted, f"add the missing settings to _full and to adopt's mapping: {wanted - covered}"


# --- the reference command of the issue ---------------------------------------------------

REFERENCE_ENV = {
    "NCCL_PROTO": "LL",
    "NCCL_ALGO": "Ring",
    "NCCL_P2P_LEVEL": "SYS",
    "NCCL_MIN_NCHANNELS": "16",
    "NCCL_BUFFSIZE": "16777216",
    "NCCL_NTHREADS": "512",
}
REFERENCE = shlex.split(  # the command, as the shell reads it
    "python3 -m sglang.launch_server --model-path /data/models/Kimi-K2.5 --tp 8 --trust-remote-code "
    "--speculative-algorithm EAGLE3 --speculative-draft-model-path /data/eagle3/output_10k_sglang/4 "
    "--speculative-num-steps 3 --speculative-eagle-topk 4 --speculative-num-draft-tokens 5 "
    "--mem-fraction-static 0.85 --port 30000"
)


def hand(argv: list[str], env: dict[str, str] | None = None, **changes: Any) -> Live:
    """A server started by hand as root over ssh, from root's home."""
    fields: dict[str, Any] = {
        "argv": argv,
        "env": {**REFERENCE_ENV, **SHELL} if env is None else env,
        "secrets": {},
        "python": "/usr/bin/python3",
        "cwd": "/root",
        "user": "root",
        "entry": "module",
        "host": "gpu1",
        "pid": 4242,
    }
    return Live(**(fields | changes))


def test_the_reference_command() -> None:
    live = hand(REFERENCE)
    adoption = adopt(live, name="kimi", version="0.5.9")
    assert adoption.problems == []
    assert adoption.data == {
        "description": "Adopted from gpu1 PID 4242 (root, started by hand)",
        "server": {
            "sglang_version": "0.5.9",
            "python": "/usr/bin/python3",
            "model_path": "/data/models/Kimi-K2.5",
            "tp_size": 8,
            "mem_fraction_static": 0.85,
            "trust_remote_code": True,
        },
        "speculative": {
            "algorithm": "EAGLE3",
            "draft_model_path": "/data/eagle3/output_10k_sglang/4",
            "num_steps": 3,
            "eagle_topk": 4,
            "num_draft_tokens": 5,
        },
        "nccl": REFERENCE_ENV,
        "service": {"working_directory": "/root", "compile_cache": False},
    }
    assert list(adoption.data["nccl"]) == list(REFERENCE_ENV)  # as the live environment lists them
    assert set(adoption.left_out) == set(SHELL)
    assert adoption.left_out["SSH_CONNECTION"] == "the SSH session's"
    assert adoption.secret_files == {}
    assert adoption.profile is not None
    differences = compare(adoption.profile, live, "0.5.9")
    assert changing(differences) == []
    reasons = {d.what: d.reason for d in differences}
    assert reasons["python"] == "python3 -> /usr/bin/python3 (a unit needs an absolute path)"
    assert reasons["--tensor-parallel-size"] == "--tp spelled --tensor-parallel-size"
    assert reasons["--host"] == "default made explicit (--host 127.0.0.1)"
    assert "order" in reasons and "PYTHONUNBUFFERED" in reasons
    assert {d.what for d in differences if d.kind == "env"} == {*SHELL, "PYTHONUNBUFFERED"}  # NCCL: equal


def test_the_reference_profile_renders_the_reference_argv() -> None:
    adoption = adopt(hand(REFERENCE), name="kimi", version="0.5.9")
    assert adoption.profile is not None
    plan = launch.build(adoption.profile)
    parser = sglang_flags.build_parser(sglang_flags.flag_table("0.5.9"))
    assert vars(parser.parse_args(plan.argv[3:])) == vars(
        parser.parse_args([*REFERENCE[3:], "--host", "127.0.0.1"])
    )
    assert {k: v for k, v in plan.environment.items() if k.startswith("NCCL_")} == REFERENCE_ENV


# --- hostile and odd inputs -------------------------------------------------------------------


def test_a_flag_unknown_to_the_version_is_a_problem() -> None:
    argv = [*REFERENCE, "--cuda-graph-max-seq-len-prefill", "8"]  # 0.5.23 has it, 0.5.9 not
    adoption = adopt(hand(argv), name="kimi", version="0.5.9")
    assert adoption.profile is None
    assert any(
        "--cuda-graph-max-seq-len-prefill is not a flag of SGLang 0.5.9" in p for p in adoption.problems
    )
    assert adopt(hand(argv), name="kimi", version="0.5.23").problems == []


@pytest.mark.parametrize(
    ("words", "problem"),
    [
        (["--nnodes", "2", "--node-rank", "0"], "a multi-node server"),
        (["--dist-init-addr", "10.0.0.1:5757"], "only for a multinode deployment"),
        (["--config", "/etc/sglang.yaml"], "a config file of the server's own"),
        (["--admin-api-key", SECRET], "--admin-api-key carries a secret the profile cannot hold"),
        (["--help"], "prints SGLang's help"),
        (["--tp", "100"], "server.tp_size:"),  # argparse takes it, the profile's rule does not
        (["--speculative-adaptive-config", "/x.json"], "not a flag of SGLang 0.5.9"),
        (["--port", "x"], "argparse refuses it: argument --port: invalid int value: 'x'"),
        (["--a=sk-live-123"], "--a: SGLang 0.5.9's argparse refuses it"),
    ],
)
def test_what_a_profile_cannot_say_is_a_problem(words: list[str], problem: str) -> None:
    adoption = adopt(hand([*REFERENCE, *words]), name="kimi", version="0.5.9")
    assert adoption.profile is None
    assert any(problem in p for p in adoption.problems), adoption.problems


def test_one_node_written_out_is_the_default() -> None:
    live = hand([*REFERENCE, "--nnodes", "1", "--node-rank", "0", "--dp-size", "1"])
    adoption = adopt(live, name="kimi", version="0.5.9")
    assert adoption.problems == []
    assert adoption.profile is not None
    assert "--nnodes 1 is SGLang's default: left out" in adoption.notes
    differences = compare(adoption.profile, live, "0.5.9")
    assert changing(differences) == []
    assert {d.reason for d in differences if d.what == "--nnodes"} == {
        "SGLang's default, written out on the live command line (--nnodes 1)"
    }


def test_prefixes_aliases_and_equals_forms_resolve_as_argparse_does() -> None:
    argv = ["python3", "-m", "sglang.launch_server", "--model", "/m", "--tp-size=4", "--mem-frac", "0.50"]
    argv += ["--trust", "--port=8000"]
    argv += ["--speculative-alg", "EAGLE", "--speculative-draft-model", "/d", "--context-length=8k"]
    live = hand(argv, env={})
    adoption = adopt(live, name="p", version="0.5.15")
    assert adoption.problems == []
    server = adoption.data["server"]
    assert (server["model_path"], server["tp_size"], server["port"], server["context_length"]) == (
        "/m",
        4,
        8000,
        8000,
    )
    assert server["mem_fraction_static"] == 0.5 and server["trust_remote_code"] is True
    assert adoption.data["speculative"] == {"algorithm": "EAGLE", "draft_model_path": "/d"}
    assert adoption.profile is not None
    reasons = {d.what: d.reason for d in compare(adoption.profile, live, "0.5.15") if d.harmless}
    assert reasons["--model-path"] == "--model spelled --model-path"
    assert reasons["--tensor-parallel-size"] == (
        "--tp-size spelled --tensor-parallel-size; --tp-size=4 written as --tensor-parallel-size 4"
    )
    assert reasons["--port"] == "--port=8000 written as --port 8000"
    assert (
        reasons["--mem-fraction-static"]
        == "--mem-frac spelled --mem-fraction-static; 0.50 written 0.5, the same value"
    )
    assert reasons["--context-length"] == "8k written 8000, the same value"
    assert changing(compare(adoption.profile, live, "0.5.15")) == []
    # 0.5.20 has --trust-mm-content-hashes too: the prefix is ambiguous there, as on such a host.
    assert any("ambiguous option: --trust" in p for p in adopt(live, name="p", version="0.5.20").problems)


def test_a_flag_given_twice_keeps_the_last() -> None:
    argv = [*REFERENCE, "--port", "30001", "--max-running-requests", "4", "--max-running-requests", "8"]
    live = hand(argv)
    adoption = adopt(live, name="p", version="0.5.9")
    assert adoption.data["server"]["port"] == 30001
    assert adoption.data["server"]["extra_args"] == [
        "--max-running-requests",
        "4",
        "--max-running-requests",
        "8",
    ]
    assert (
        "--port is given 2 times: argparse keeps the last (--port 30001), as the profile does"
        in adoption.notes
    )
    assert any(n.startswith("--max-running-requests is given 2 times") for n in adoption.notes)
    assert adoption.profile is not None
    differences = compare(adoption.profile, live, "0.5.9")
    assert changing(differences) == []
    assert "given 2 times: argparse keeps the last" in {d.what: d.reason for d in differences}["--port"]


def test_flags_the_model_has_no_field_for_stay_word_for_word() -> None:
    extra = ["--max-running=8", "--json-model-override-args", '{"a": [1, 2]}', "--lora-paths", "a", "b c"]
    extra += ["--random-seed", "-3", "--schedule-pol=lpm", "--disable-radix-cache"]
    live = hand([*REFERENCE, *extra])
    adoption = adopt(live, name="p", version="0.5.23")
    assert adoption.problems == []
    assert adoption.data["server"]["extra_args"] == extra
    assert adoption.profile is not None
    plan = launch.build(adoption.profile)
    assert plan.argv[-len(extra) :] == extra
    assert not [
        d for d in compare(adoption.profile, live, "0.5.23") if d.what.startswith(("--max", "--lora"))
    ]


def test_secrets_never_reach_the_profile() -> None:
    env = {**REFERENCE_ENV, "HF_TOKEN": SECRET, "WANDB_API_KEY": "not-redacted-value", "MY_PASSWORD": SECRET}
    live = hand([*REFERENCE, "--api-key", SECRET], env=env, secrets={"--api-key": SHA, "HF_TOKEN": SHA})
    adoption = adopt(live, name="kimi", version="0.5.9")
    assert adoption.problems == []
    text = yaml.safe_dump(adoption.data)
    assert SECRET not in text and SHA not in text and "not-redacted-value" not in text
    assert adoption.data["api_key"] == {"file": "secrets/kimi/api_key"}
    assert adoption.data["secret_env"] == {
        "HF_TOKEN": {"file": "secrets/kimi/HF_TOKEN"},
        "WANDB_API_KEY": {"file": "secrets/kimi/WANDB_API_KEY"},
        "MY_PASSWORD": {"file": "secrets/kimi/MY_PASSWORD"},
    }
    assert adoption.secret_files["--api-key"] == "secrets/kimi/api_key"
    assert adoption.secret_files["HF_TOKEN"] == "secrets/kimi/HF_TOKEN"
    assert adoption.profile is not None
    differences = compare(adoption.profile, live, "0.5.9")
    assert {d.what: d.reason for d in differences}["--api-key"] == (
        "--api-key passed in a --config file only the server reads (LoadCredential=)"
    )
    assert changing(differences) == []
    shown = {d.what: d.live for d in differences}
    assert shown["WANDB_API_KEY"] == SECRET  # what the host left in the clear, compare does not show


def test_a_secret_value_is_never_echoed() -> None:
    adoption = adopt(hand([*REFERENCE, "--a=sk-live-123"]), name="p", version="0.5.9")  # ambiguous
    assert adoption.problems and not any("sk-live-123" in p for p in adoption.problems)
    live = hand([*REFERENCE, "--api-k=sk-live-123"])  # a spelling the host did not redact
    adoption = adopt(live, name="p", version="0.5.9")
    assert adoption.profile is not None and "sk-live-123" not in yaml.safe_dump(adoption.data)
    assert not [d for d in compare(adoption.profile, live, "0.5.9") if "sk-live-123" in str(d)]


@pytest.mark.parametrize("algorithm", ["EAGLE", "EAGLE3"])
def test_the_algorithm_is_kept_exactly(algorithm: str) -> None:
    argv = [*REFERENCE[:9], algorithm, *REFERENCE[10:]]
    adoption = adopt(hand(argv), name="p", version="0.5.9")
    assert adoption.data["speculative"]["algorithm"] == algorithm


def test_compare_names_a_real_difference() -> None:
    live = hand([*REFERENCE[:9], "EAGLE", *REFERENCE[10:]])
    adoption = adopt(live, name="p", version="0.5.9")
    assert adoption.data["speculative"]["algorithm"] == "EAGLE"
    other = validate(
        {"name": "p", **adoption.data, "speculative": {**adoption.data["speculative"], "algorithm": "EAGLE3"}}
    )
    (wrong,) = changing(compare(other, live, "0.5.9"))
    assert (wrong.what, wrong.live, wrong.rendered) == (
        "--speculative-algorithm",
        "--speculative-algorithm EAGLE",
        "--speculative-algorithm EAGLE3",
    )
    assert wrong.reason == "SGLang reads another value"


def test_compare_names_a_changed_or_missing_variable() -> None:
    live = hand(REFERENCE, env={**REFERENCE_ENV, "LANG": "C.UTF-8"})
    adoption = adopt(live, name="p", version="0.5.9")
    data = {"name": "p", **adoption.data, "nccl": {**REFERENCE_ENV, "NCCL_PROTO": "Simple"}, "env": {}}
    wrong = {d.what: d for d in changing(compare(validate(data), live, "0.5.9"))}
    assert set(wrong) == {"NCCL_PROTO", "LANG"}
    assert wrong["LANG"].reason == "only in the live environment: the unit would start without it"


def test_environment_mapping() -> None:
    env = {
        **REFERENCE_ENV,
        "CUDA_VISIBLE_DEVICES": "4,5,6,7,0,1,2,3",
        "PYTHONUNBUFFERED": "1",
        "TMUX": "/tmp/tmux-0/default,1,0",
        "TMUX_PANE": "%1",
        "HOME": "/home/ops",
        "USER": "root",
        "PATH": "/opt/venv/bin:/usr/bin",
        "BASH_FUNC_module%%": "() { :; }",
        "LD_PRELOAD": "/usr/lib/libjemalloc.so",
    }
    live = hand(REFERENCE, env=env)
    adoption = adopt(live, name="p", version="0.5.9")
    assert adoption.problems == []
    assert adoption.data["server"]["gpus"] == [4, 5, 6, 7, 0, 1, 2, 3]
    assert adoption.data["env"] == {
        "HOME": "/home/ops",
        "PATH": "/opt/venv/bin:/usr/bin",
        "LD_PRELOAD": "/usr/lib/libjemalloc.so",
    }
    assert set(adoption.left_out) == {"TMUX", "TMUX_PANE", "USER", "BASH_FUNC_module%%"}
    assert adoption.profile is not None
    assert changing(compare(adoption.profile, live, "0.5.9")) == []


def test_a_user_and_its_passwd_entry() -> None:
    env = {
        "HOME": "/home/sglang",
        "SHELL": "/bin/zsh",
        "USER": "sglang",
        "LOGNAME": "sglang",
        "PATH": "/usr/local/bin:/usr/bin",
    }
    live = hand(
        REFERENCE, env=env, user="sglang", cwd="/", passwd_home="/home/sglang", passwd_shell="/bin/zsh"
    )
    adoption = adopt(live, name="p", version="0.5.9")
    assert adoption.data["service"] == {"user": "sglang", "compile_cache": False}
    assert set(adoption.left_out) == set(env)
    # A manager's PATH read from the host is the one that counts.
    other = adopt(hand(REFERENCE, env=env, user="sglang", systemd_path="/usr/bin"), name="p", version="0.5.9")
    assert other.data["env"] == {
        "HOME": "/home/sglang",
        "SHELL": "/bin/zsh",
        "PATH": "/usr/local/bin:/usr/bin",
    }


def test_compile_caches_the_live_server_already_uses() -> None:
    caches = {name: f"/var/cache/orchestrator/sglang/{sub}" for name, sub in launch.COMPILE_CACHES.items()}
    live = hand(REFERENCE, env={**caches, "TRITON_CACHE_DIR": "/data/triton"})
    adoption = adopt(live, name="p", version="0.5.9")
    assert "compile_cache" not in adoption.data["service"]
    assert adoption.data["env"] == {"TRITON_CACHE_DIR": "/data/triton"}
    assert adoption.profile is not None
    assert changing(compare(adoption.profile, live, "0.5.9")) == []


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({"CUDA_VISIBLE_DEVICES": "GPU-8a1f,GPU-77c2"}, "is not a list of GPU indexes"),
        ({"CUDA_VISIBLE_DEVICES": "0,1"}, "server.gpus: lists 2 GPUs, but TP x DP needs 8"),
        ({"NCCL_PROTOCOL": "LL"}, "nccl.NCCL_PROTOCOL: unknown NCCL variable"),
        ({"NCCL_ALGO": SECRET}, "NCCL_ALGO was redacted"),
        ({"LANG": "C.\udcff"}, "the value of 'LANG' is not UTF-8"),
        ({"my-var": "1"}, "env.my-var: not a valid environment variable name"),
    ],
)
def test_what_the_environment_cannot_say_is_a_problem(env: dict[str, str], problem: str) -> None:
    adoption = adopt(hand(REFERENCE, env=env), name="p", version="0.5.9")
    assert adoption.profile is None
    assert any(problem in p for p in adoption.problems), adoption.problems


def test_a_word_that_is_not_utf8() -> None:
    adoption = adopt(hand([*REFERENCE[:4], "/data/m\udcff", *REFERENCE[5:]]), name="p", version="0.5.9")
    assert "argv word 4 is not UTF-8: a unit and a profile hold text only" in adoption.problems


def test_how_it_was_started() -> None:
    serve = ["/usr/bin/python3", "/usr/local/bin/sglang", "serve", "/m", "--model-type", "llm", "--tp", "2"]
    live = hand(serve, env={}, entry="serve")
    adoption = adopt(live, name="p", version="0.5.23")
    assert adoption.problems == []
    assert (adoption.data["server"]["model_path"], adoption.data["server"]["tp_size"]) == ("/m", 2)
    assert adoption.profile is not None
    entry = {d.what: d for d in compare(adoption.profile, live, "0.5.23")}["entry"]
    assert entry.harmless and entry.live == "/usr/local/bin/sglang serve"
    diffusion = hand([*serve[:3], "--model-type=diffusion", "--model-path", "/m"], env={}, entry="serve")
    assert any("only a language model" in p for p in adopt(diffusion, name="p", version="0.5.23").problems)
    unbuffered = hand(["/usr/bin/python3", "-u", *REFERENCE[1:]])
    adoption = adopt(unbuffered, name="p", version="0.5.9")
    assert adoption.problems == [] and adoption.profile is not None
    assert changing(compare(adoption.profile, unbuffered, "0.5.9")) == []
    other = hand(["/usr/bin/python3", "-X", "dev", *REFERENCE[1:]])
    assert any("Python options '-X dev'" in p for p in adopt(other, name="p", version="0.5.9").problems)


def test_an_adaptive_config_file() -> None:
    text = '{"ema_alpha": 0.3, "1": {"candidate_steps": [1, 3]}, "8": {"candidate_steps": [0, 1]}}'
    argv = [*REFERENCE[:9], "EAGLE3", *REFERENCE[10:12], "--speculative-adaptive"]
    argv += ["--speculative-adaptive-config", "/data/tiers.json"]
    live = hand(argv, adaptive_config=text)
    adoption = adopt(live, name="p", version="0.5.23")
    assert adoption.problems == []
    assert adoption.data["speculative"]["adaptive"] == {"tiers": {1: [1, 3], 8: [0, 1]}, "ema_alpha": 0.3}
    assert adoption.profile is not None
    assert changing(compare(adoption.profile, live, "0.5.23")) == []
    unread = adopt(hand(argv), name="p", version="0.5.23")
    assert any("its file was not read" in p for p in unread.problems)
    odd = adopt(
        hand(argv, adaptive_config='{"1": {"candidate_steps": [1], "ema_alpha": 0.1}}'),
        name="p",
        version="0.5.23",
    )
    assert any("tier 1 holds more than candidate_steps" in p for p in odd.problems)
    # Another file's settings are another server.
    assert adoption.profile is not None
    other = hand(argv, adaptive_config='{"1": {"candidate_steps": [1, 3, 5]}}')
    assert [d.what for d in changing(compare(adoption.profile, other, "0.5.23"))] == [
        "--speculative-adaptive-config"
    ]
