"""DeepSpeed-format hostfiles and `--include` / `--exclude` filters: plain data in, plain data out.

A hostfile lists one machine a line, `worker-1 slots=4`, where slots is how many processes (GPUs)
that machine runs; `#` starts a comment and blank lines are skipped. A filter is
`host1@host2:0,2`: hosts joined by `@`, each optionally followed by `:` and the slot ids to use.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path

from .errors import FilterError, HostfileError, LaunchError

Resources = dict[str, list[int]]  # host -> slot ids it runs, in hostfile order

_LINE = re.compile(r"^(?P<host>\S+)\s+slots\s*=\s*(?P<slots>\S+)$")
# Host names reach ssh and pdsh as arguments: one starting with '-' would be read as an option
# (`-Fconfig` runs that config's ProxyCommand), so only real names and addresses pass.
_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")  # '_' is common in cluster names
_ZONE = re.compile(r"[A-Za-z0-9_.-]+")  # the interface of a link-local IPv6 address, fe80::1%eth0
HOST_RULE = ("a host name (dot-separated labels of letters, digits, '-' and '_', each at most 63 characters "
             "and not starting or ending with '-'), an IPv4 address or an IPv6 address without brackets")


def is_host(host: str) -> bool:
    """Whether `host` is a host name, an IPv4 address or an IPv6 address (so never an option)."""
    if ":" in host:
        address, _, zone = host.partition("%")
        try:
            ipaddress.IPv6Address(address)
        except ValueError:
            return False
        return "%" not in host or bool(_ZONE.fullmatch(zone))
    name = host[:-1] if host.endswith(".") else host  # a fully qualified name may end with a dot
    return 0 < len(name) <= 253 and all(_LABEL.fullmatch(label) for label in name.split("."))


def check_host(host: str, option: str) -> str:
    """`host`, or a LaunchError naming `option` when it is not a host name or address."""
    if not is_host(host):
        raise LaunchError(f"{option} {host!r}: not a host name or address; expected {HOST_RULE}")
    return host


def parse_hostfile(path: str | Path) -> dict[str, int]:
    """Read `path` into {host: slots}, in file order. Every bad line is reported at once."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise HostfileError(f"cannot read hostfile {path}: {exc.strerror or exc}") from exc
    return parse_hostfile_text(text, str(path))


def parse_hostfile_text(text: str, source: str = "<hostfile>") -> dict[str, int]:
    hosts: dict[str, int] = {}
    first_seen: dict[str, int] = {}
    problems: list[str] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source}:{number}: {raw.strip()!r}"
        match = _LINE.match(line)
        if match is None:
            problems.append(f"{where}: expected 'HOSTNAME slots=N'")
            continue
        host, slots_text = match["host"], match["slots"]
        if not is_host(host):
            problems.append(f"{where}: {host!r} is not a host name or address; expected {HOST_RULE}")
            continue
        try:
            slots = int(slots_text)
        except ValueError:
            slots = 0
        if slots <= 0:
            problems.append(f"{where}: slots must be a positive integer, got {slots_text!r}")
            continue
        if host in hosts:
            problems.append(f"{where}: host {host!r} is listed twice (first on line {first_seen[host]})")
            continue
        hosts[host] = slots
        first_seen[host] = number
    if problems:
        raise HostfileError("bad hostfile:\n  " + "\n  ".join(problems))
    if not hosts:
        raise HostfileError(f"hostfile {source} lists no hosts; expected lines like 'worker-1 slots=4'")
    return hosts


def _slot_text(slots: list[int]) -> str:
    """[0, 1, 2, 5] -> '0..2' when contiguous from 0, else '0, 1, 2, 5' (for messages)."""
    return f"0..{len(slots) - 1}" if slots == list(range(len(slots))) else ", ".join(map(str, slots))


def parse_filter(spec: str, resources: Resources, option: str) -> dict[str, list[int] | None]:
    """Parse `host1@host2:0,2` into {host: slot ids, or None for every slot}, checked against `resources`
    (host -> the slot ids it has)."""
    chosen: dict[str, list[int] | None] = {}
    for part in spec.split("@"):
        part = part.strip()
        if not part:
            raise FilterError(f"{option} {spec!r}: empty host entry (hosts are joined by '@')")
        host, _, slot_text = part.partition(":")
        if not is_host(host):
            raise FilterError(f"{option} {spec!r}: {host!r} is not a host name or address; expected {HOST_RULE}")
        if host not in resources:
            raise FilterError(f"{option} {spec!r}: host {host!r} is not in the hostfile "
                              f"(hosts: {', '.join(resources)})")
        if not slot_text:
            chosen[host] = None  # every slot
            continue
        slots: list[int] = []
        for item in slot_text.split(","):
            try:
                slot = int(item)
            except ValueError:
                raise FilterError(f"{option} {spec!r}: slot {item!r} of {host} is not an integer") from None
            if slot not in resources[host]:
                raise FilterError(f"{option} {spec!r}: {host} has slots {_slot_text(resources[host])}, not {slot}")
            if slot not in slots:
                slots.append(slot)
        if host in chosen and chosen[host] is None:
            continue  # the host was already named whole
        chosen[host] = sorted({*(chosen.get(host) or []), *slots})
    return chosen


def filter_resources(resources: Resources, include: str = "", exclude: str = "") -> Resources:
    """`resources` (host -> slot ids) narrowed by an `--include` or an `--exclude` filter, in `resources`'
    order; it may come out empty (everything excluded). A bad filter is a FilterError (a ValueError)."""
    if include and exclude:
        raise FilterError("--include and --exclude cannot be used together; use one of them")
    if include:
        chosen = parse_filter(include, resources, "--include")
        return {h: (list(slots) if chosen[h] is None else chosen[h]) for h, slots in resources.items()
                if h in chosen}
    if exclude:
        dropped = parse_filter(exclude, resources, "--exclude")
        result: Resources = {}
        for host, slots in resources.items():
            gone = dropped.get(host, [])
            if gone is None:
                continue
            kept = [s for s in slots if s not in gone]
            if kept:
                result[host] = kept
        return result
    return {h: list(slots) for h, slots in resources.items()}


def select_resources(hosts: dict[str, int], include: str = "", exclude: str = "",
                     num_nodes: int | None = None, num_procs: int | None = None) -> Resources:
    """Which slots of which hosts the job uses, DeepSpeed's way.

    `include` keeps only what it names; `exclude` drops what it names (a bare host drops the whole
    host). `num_nodes` keeps the first N hosts and `num_procs` the first N slots of each. Filters
    and counts do not combine, as in DeepSpeed.
    """
    if (include or exclude) and (num_nodes is not None or num_procs is not None):
        raise FilterError("--include/--exclude cannot be combined with --num_nodes/--num_gpus/--num_procs; "
                          "name the slots in the filter instead")
    everything: Resources = {host: list(range(slots)) for host, slots in hosts.items()}
    result = filter_resources(everything, include, exclude)
    if not (include or exclude):
        if num_nodes is not None:
            if num_nodes <= 0 or num_nodes > len(hosts):
                raise LaunchError(f"--num_nodes {num_nodes}: the hostfile has {len(hosts)} host(s)")
            result = dict(list(result.items())[:num_nodes])
        if num_procs is not None:
            if num_procs <= 0:
                raise LaunchError(f"--num_gpus/--num_procs must be positive, got {num_procs}")
            result = {h: s[:num_procs] for h, s in result.items()}
    if not result:
        raise LaunchError("no slots left to run on after --include/--exclude")
    return result
