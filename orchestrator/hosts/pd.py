"""A prefill/decode disaggregated fleet (docs/pd.md): each role's profile on its inventory group.

The inventory groups `prefill` and `decode` say which hosts serve each role
(playvars.role_hosts). A deploy of both roles runs the prefill role first, then the decode role:
a decode server needs a prefill server to serve at all. Behind a gateway in PD mode each role
rolls one batch at a time, and never takes out the last server of a role in rotation (the
sglang_gateway module checks it again before each batch).

Engine layer: never prints.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from orchestrator import ledger
from orchestrator.errors import InputError, OrchestratorError
from orchestrator.hosts import deploy as deploy_mod
from orchestrator.hosts import inventory as inventory_mod
from orchestrator.hosts.host_report import DeployReport
from orchestrator.hosts.runner import TaskEvent
from orchestrator.profile import model as profile_mod
from orchestrator.profile import sglang_flags
from orchestrator.profile.model import Profile

#: The roles in the order a deploy of the whole fleet restarts them.
ROLES = ("prefill", "decode")


def role(prof: Profile) -> str | None:
    return prof.disaggregation.mode if prof.disaggregation else None


def ordered(profiles: Sequence[Profile]) -> list[Profile]:
    """The profiles of one deploy in the order they roll (prefill first). Several profiles are a
    PD fleet: one prefill and one decode profile that agree on what spans the two (InputError)."""
    if len(profiles) == 1:
        return list(profiles)
    plain = [p.name for p in profiles if role(p) is None]
    if plain:
        raise InputError(
            f"several profiles make one prefill/decode fleet, and {plain[0]} has no disaggregation "
            "section: give one prefill and one decode profile, or deploy one profile"
        )
    roles = sorted(profiles, key=lambda p: ROLES.index(str(role(p))))
    if [role(p) for p in roles] != list(ROLES):
        raise InputError(
            f"a prefill/decode fleet takes one prefill and one decode profile; given: "
            f"{', '.join(f'{p.name} ({role(p)})' for p in roles)}"
        )
    prefill, decode = roles
    problems = pair_problems(prefill, decode)
    if problems:
        raise InputError(f"{prefill.name} and {decode.name} do not make one fleet: " + "; ".join(problems))
    return roles


def served_name(prof: Profile) -> str:
    """The model name clients ask for: served_model_name, else SGLang's default, the model path."""
    return prof.server.served_model_name or prof.server.model_path


def pair_problems(prefill: Profile, decode: Profile) -> list[str]:
    """What a prefill and a decode profile must share: the model whose KV cache moves between them,
    the name clients ask for, and how the KV cache moves."""
    p_pd, d_pd = prefill.disaggregation, decode.disaggregation
    assert p_pd is not None and d_pd is not None
    problems = []
    if prefill.server.model_path != decode.server.model_path:
        problems.append(
            f"server.model_path differs ({prefill.server.model_path} and {decode.server.model_path}): "
            "the decode server continues the prefill server's KV cache, of one model"
        )
    if served_name(prefill) != served_name(decode):
        problems.append(
            f"the served model name differs ({served_name(prefill)} and {served_name(decode)}): "
            "the gateway routes each request to a pair that must answer to one name"
        )
    if p_pd.bootstrap_port != d_pd.bootstrap_port:
        problems.append(
            f"disaggregation.bootstrap_port differs ({p_pd.bootstrap_port} and {d_pd.bootstrap_port}): a "
            "decode server takes its own for a request whose gateway names none"
        )
    p_spec, d_spec = prefill.speculative, decode.speculative
    if (p_spec.algorithm, p_spec.draft_model_path) != (d_spec.algorithm, d_spec.draft_model_path):
        problems.append(
            f"speculative decoding differs ({_spec(prefill)} and {_spec(decode)}): the prefill server "
            "runs the drafter's first step and sends its hidden states with the KV cache; give both the "
            "same speculative.algorithm and draft_model_path (steps and draft tokens may differ)"
        )
    p_topk, d_topk = p_spec.eagle_topk, d_spec.eagle_topk
    if p_spec.algorithm and p_topk is not None and d_topk is not None and d_topk > p_topk:
        problems.append(
            f"decode's speculative.eagle_topk {d_topk} is above prefill's {p_topk}: the prefill server "
            f"sends {p_topk} draft candidates, and the decode server would read padding for the rest"
        )
    p_page, d_page = _page_size(prefill), _page_size(decode)
    if p_page != d_page:
        problems.append(
            f"--page-size differs ({p_page or 'default'} and {d_page or 'default'}): SGLang refuses every "
            "request of a pair whose KV pages differ; give both the same"
        )
    if p_pd.transfer_backend != d_pd.transfer_backend:
        problems.append(
            f"disaggregation.transfer_backend differs ({p_pd.transfer_backend} and {d_pd.transfer_backend}): "
            "both ends of a KV transfer use one backend"
        )
    return problems


def _page_size(prof: Profile) -> object:
    return sglang_flags.option_values(prof.server.sglang_version, prof.server.extra_args).get("--page-size")


def _fits_the_running_peer(prof: Profile, inventory: Path, fix: str) -> None:
    """One role deployed alone must fit what the other role's hosts run (their last good unit's
    profile, in the ledger). A profile the ledger names but this machine cannot load is not judged."""
    mode = role(prof)
    if mode is None:
        return
    other = "decode" if mode == "prefill" else "prefill"
    for host in inventory_mod.hosts(inventory):
        good = ledger.good_unit(host.name, prof.service.unit_name) if host.pd_role == other else None
        if good is None:
            continue
        try:
            peer = profile_mod.load(str(good["profile"]))
        except OrchestratorError:
            continue
        if role(peer) != other:
            continue
        pair = (prof, peer) if mode == "prefill" else (peer, prof)
        problems = pair_problems(*pair)
        if problems:
            raise InputError(
                f"{prof.name} does not fit {peer.name}, which {host.name} ({other}) runs: "
                + "; ".join(problems)
                + f"; {fix}"
            )
        return


def _spec(prof: Profile) -> str:
    spec = prof.speculative
    return f"{spec.algorithm} {spec.draft_model_path}" if spec.algorithm else "none"


def deploy(
    profiles: Sequence[Profile],
    inventory: Path,
    options: deploy_mod.Options,
    on_event: Callable[[TaskEvent], None] | None = None,
) -> DeployReport:
    """Deploy each role's profile onto its group, prefill first; the decode role only once every
    prefill host is healthy. One profile: that role alone, as deploy.deploy does it."""
    order = ordered(profiles)
    if len(order) == 1:
        _fits_the_running_peer(order[0], inventory, "deploy both roles together (-p PREFILL -p DECODE)")
    elif options.drain and not options.check:
        # Prefill rolls first: while it does, the old decode servers must fit the new prefill ones.
        _fits_the_running_peer(
            order[0],
            inventory,
            "a change to what both roles share cannot roll without an outage: deploy with --no-drain",
        )
    for prof in order[1:]:  # the decode role's checks, before the prefill role rolls
        deploy_mod.ready_to_roll(prof, inventory, options)
    reports = []
    for prof in order:
        report = deploy_mod.deploy(prof, inventory, options, on_event)
        reports.append(report)
        if not report.ok or report.interrupted:
            break
    if len(order) == 1:
        return reports[0]
    merged = DeployReport(
        "+".join(p.name for p in order),
        "",
        options.check,
        [h for r in reports for h in r.hosts],
        reports[-1].artifacts,
        reports[0].run_id,
    )
    merged.interrupted = any(r.interrupted for r in reports)
    if len(reports) < len(order):
        left = order[len(reports)]
        for h in merged.hosts:
            if not h.ok:
                h.diagnosis = h.diagnosis or f"{left.name} ({role(left)}) was not deployed: this host failed"
    return merged
