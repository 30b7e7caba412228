"""The picture of the node that ``numa-pin status --map`` draws (pure).

:func:`picture` turns the machine, the ledger and what the edges read (reserved, isolated and
offline CPUs, the device inventory, the memory tables) into plain data: per NUMA node, its CPUs
as a grid of cores by threads, each CPU marked by its one holder; memory and hugepages used
against what is allocatable; every device with its holder. :func:`render_text` draws it for a
terminal (ANSI colours only when asked) and :func:`render_html` as one standalone HTML page
(inline style, no script, no external asset) for a browser.

A CPU's holder is, first match wins: the grant that holds it exclusively (its short id),
``reserved`` (kept for the system), ``isolated`` (the kernel's isolcpus), else ``shared``; an
offline CPU is ``offline`` and sits in its node's ``offline`` row (the kernel gives it no core).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape

from numa_pin.base.cpuset import format_list
from numa_pin.base.quantity import parse_bytes
from numa_pin.base.text import one_line
from numa_pin.devices.model import DeviceInfo
from numa_pin.ledger.model import LedgerState
from numa_pin.topology.model import Topology

SHARED, RESERVED, ISOLATED, OFFLINE, FREE = "shared", "reserved", "isolated", "offline", "free"
#: the colours of the holders that are not grants (also the HTML legend's swatches)
COLOURS = {SHARED: "#cfe2f3", RESERVED: "#595959", ISOLATED: "#ffd966", OFFLINE: "#000000", FREE: "#ffffff"}
#: grants take these in turn (sorted by short id)
GRANT_COLOURS = ("#e6194b", "#3cb44b", "#4363d8", "#f58231", "#911eb4", "#42d4f4", "#f032e6", "#bfef45",
                 "#469990", "#9a6324", "#800000", "#808000", "#000075", "#fabed4", "#aaffc3", "#dcbeff")
#: ANSI SGR codes per holder kind (grants: 256-colour backgrounds in turn)
_ANSI = {SHARED: "2", RESERVED: "7", ISOLATED: "30;43", OFFLINE: "9;2", FREE: "2"}
_ANSI_GRANTS = (196, 34, 27, 208, 93, 45, 201, 148, 30, 130, 88, 100, 18, 218, 121, 183)
#: longest holder label drawn (ids are cut to it)
MAX_LABEL = 24
#: the width of the terminal text (a terminal's usual 80 columns)
COLUMNS = 80


def picture(
    topology: Topology,
    state: LedgerState,
    *,
    short: Mapping[str, str],
    reserved: frozenset[int] = frozenset(),
    isolated: frozenset[int] = frozenset(),
    offline: Mapping[int, int | None] | None = None,
    devices: Mapping[str, Sequence[DeviceInfo]] | None = None,
    memory_zones: Mapping[int, Sequence[Mapping[str, str]]] | None = None,
) -> dict:
    """The node as data: ``{"legend": [...], "nodes": [...], "elsewhere": {...}}``.

    ``short`` maps container ids to the labels drawn; ``offline`` maps offline CPUs to their node
    (None: unknown); ``memory_zones`` are the memory resource's NRT zones per node
    (:meth:`~numa_pin.resources.base.Resource.zones`)."""
    holder_of: dict[int, str] = {}
    legend: dict[str, dict[str, str]] = {}
    grants = sorted((g for g in state.grants.values() if g.cpus or g.devices),
                    key=lambda g: _label(short.get(g.container_id, g.container_id)))
    by_id: dict[str, str] = {}
    for i, grant in enumerate(grants):
        label = _label(short.get(grant.container_id, grant.container_id))
        by_id[grant.container_id] = label
        legend[label] = {"label": label, "kind": "grant", "colour": GRANT_COLOURS[i % len(GRANT_COLOURS)],
                         "ansi": f"38;5;15;48;5;{_ANSI_GRANTS[i % len(_ANSI_GRANTS)]}",
                         "what": one_line(f"{grant.container_name} ({grant.kind}, {grant.policy})")}
        for cpu in grant.cpus:
            holder_of.setdefault(cpu, label)
    for kind, what in ((RESERVED, "kept for the system"), (ISOLATED, "isolated by the kernel (isolcpus)"),
                       (SHARED, "the shared pool"), (OFFLINE, "offline"), (FREE, "a device no grant holds")):
        legend[kind] = {"label": kind, "kind": kind, "colour": COLOURS[kind], "ansi": _ANSI[kind], "what": what}
    offline = dict(offline or {})
    nodes = []
    for n in topology.node_ids:
        cores: dict[tuple[int, int, int], list[int]] = {}
        for cpu in sorted(topology.nodes[n].cpus & topology.cpu_ids):
            cores.setdefault(topology.cpus[cpu].core_key, []).append(cpu)
        rows = []
        for key, cpus in sorted(cores.items(), key=lambda kv: min(kv[1])):
            rows.append({"core": f"s{key[0]}c{key[2]}" if key[1] == 0 else f"s{key[0]}d{key[1]}c{key[2]}",
                         "cpus": [[c, _cpu_holder(c, holder_of, reserved, isolated)] for c in cpus]})
        gone = sorted(c for c, where in offline.items() if where == n)
        gone += sorted(c for c in topology.nodes[n].cpus - topology.cpu_ids if c not in offline)
        nodes.append({
            "node": n, "cpus": format_list(topology.nodes[n].cpus & topology.cpu_ids), "cores": rows,
            "offline": [[c, OFFLINE] for c in sorted(set(gone))],
            "memory": _memory_rows((memory_zones or {}).get(n, ())),
            "devices": _device_rows(devices or {}, state, by_id, n),
        })
    return {
        "legend": list(legend.values()), "nodes": nodes,
        "elsewhere": {"offline": [[c, OFFLINE] for c, where in sorted(offline.items())
                                  if where is None or where not in topology.nodes],
                      "devices": _device_rows(devices or {}, state, by_id, None)},
    }


def _label(text: str) -> str:
    out = one_line(text).replace(" ", "_")
    return out if len(out) <= MAX_LABEL else out[:MAX_LABEL - 1] + "~"


def _cpu_holder(cpu: int, holder_of: Mapping[int, str], reserved: frozenset[int], isolated: frozenset[int]) -> str:
    if cpu in holder_of:
        return holder_of[cpu]
    return RESERVED if cpu in reserved else ISOLATED if cpu in isolated else SHARED


def _memory_rows(entries: Sequence[Mapping[str, str]]) -> list[dict]:
    rows = []
    for e in entries:
        name = e["name"]
        capacity, allocatable, available = (parse_bytes(e[k], name) for k in ("capacity", "allocatable", "available"))
        rows.append({"resource": name, "used": allocatable - available, "allocatable": allocatable,
                     "capacity": capacity})
    return rows


def _device_rows(devices: Mapping[str, Sequence[DeviceInfo]], state: LedgerState, by_id: Mapping[str, str],
                 node: int | None) -> list[dict]:
    held = {(res, dev): by_id.get(g.container_id, _label(g.container_id))
            for g in state.grants.values() for res, ids in g.devices.items() for dev in ids}
    rows = []
    for res in sorted(devices):
        for d in devices[res]:
            if (node is None and d.numa_nodes) or (node is not None and node not in d.numa_nodes):
                continue
            holder = held.get((res, d.id), FREE)
            rows.append({"resource": res, "id": d.id, "holder": holder, "healthy": d.healthy})
    return rows


def human_bytes(n: int) -> str:
    """``n`` bytes in the largest binary unit it reaches, one decimal at most (``19.7Gi``, ``512Mi``, ``0``)."""
    for unit, size in (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f}".removesuffix(".0") + unit
    return str(n)


def _chunks(items: Sequence, size: int) -> list[Sequence]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def _paint(text: str, holder: str, legend: Mapping[str, Mapping[str, str]], colour: bool) -> str:
    if not colour or holder not in legend:
        return text
    return f"\x1b[{legend[holder]['ansi']}m{text}\x1b[0m"


def render_text(pic: Mapping, colour: bool = False, columns: int = COLUMNS) -> str:
    """The picture for a terminal, every line at most ``columns`` wide: per node a line of its
    CPUs, a line per memory resource, a core-by-thread grid of ``<cpu> <holder>`` cells (rows
    ``core <name>:`` and ``offline:``; a core with more threads than fit goes on in lines that
    start with blanks, under a heading line of their own), its devices; then the legend.
    ``colour`` adds ANSI colours (the caller decides: a terminal, ``NO_COLOR`` unset)."""
    legend = {e["label"]: e for e in pic["legend"]}
    width = max([len(e["label"]) for e in pic["legend"]] + [len(OFFLINE)])
    lines: list[str] = []

    def cells(pairs: Sequence[Sequence]) -> str:
        return "".join(" " + _paint(f"{cpu:>4} {holder:<{width}}", holder, legend, colour) for cpu, holder in pairs)

    for node in pic["nodes"]:
        lines += _wrap(f"node {node['node']}: CPUs {node['cpus'] or '-'}", columns, 4, ", ")
        for m in node["memory"]:
            lines += _wrap(f"  {m['resource']}: {human_bytes(m['used'])} of {human_bytes(m['allocatable'])} used",
                           columns, 4)
        threads = max((len(r["cpus"]) for r in node["cores"]), default=0)
        label_width = max([len(r["core"]) for r in node["cores"]] + [len("offline")]) + len("core ") + 1
        per_line = max(1, (columns - 2 - label_width) // (width + 6))
        for first in range(0, threads, per_line):
            head = "".join(f" {'thread ' + str(t):<{width + 5}}" for t in range(first, min(threads, first + per_line)))
            lines.append(" " * (label_width + 2) + head.rstrip())
        for row in node["cores"]:
            for i, chunk in enumerate(_chunks(row["cpus"], per_line)):
                label = "core " + row["core"] + ":" if i == 0 else ""
                lines.append(f"  {label:<{label_width}}" + cells(chunk))
        for chunk in _chunks(node["offline"], min(max(threads, 8), per_line)):
            lines.append(f"  {'offline:':<{label_width}}" + cells(chunk))
        lines += _device_lines(node["devices"], legend, colour, columns)
    elsewhere = pic["elsewhere"]
    if elsewhere["offline"] or elsewhere["devices"]:
        lines.append("no NUMA node:")
        for chunk in _chunks(elsewhere["offline"], max(1, (columns - 10) // (width + 6))):
            lines.append("  offline:" + cells(chunk))
        lines += _device_lines(elsewhere["devices"], legend, colour, columns)
    lines.append("legend:")
    for e in pic["legend"]:
        what = _wrap(e["what"], columns - width - 3, 2)
        lines.append(f"  {_paint(e['label'].ljust(width), e['label'], legend, colour)} {what[0]}")
        lines += [" " * (width + 3) + more for more in what[1:]]
    return "\n".join(line.rstrip() for line in lines) + "\n"


def _wrap(text: str, columns: int, indent: int, breaks: str = " ") -> list[str]:
    """``text`` in lines of at most ``columns``, broken after a space (or after one of
    ``breaks``), the lines after the first indented by ``indent``; a word longer than a line is cut."""
    lines: list[str] = []
    while len(text) > columns:
        cut = max(text.rfind(b, indent + 1, columns) for b in breaks)
        cut = cut + 1 if cut > indent else columns
        lines.append(text[:cut].rstrip())
        text = " " * indent + text[cut:].lstrip()
    return [*lines, text]


def _device_lines(rows: Sequence[Mapping], legend: Mapping[str, Mapping[str, str]], colour: bool,
                  columns: int) -> list[str]:
    out: list[str] = []
    for d in rows:
        head = _wrap(f"  device {one_line(d['resource'])} {one_line(d['id'])}:", columns, 4)
        tail = d["holder"] + ("" if d["healthy"] else " (unhealthy)")
        if len(head[-1]) + 1 + len(tail) > columns:
            head.append("   ")
        out += head[:-1] + [head[-1] + " " + _paint(d["holder"], d["holder"], legend, colour) + tail[len(d["holder"]):]]
    return out


_STYLE = """
body { font-family: sans-serif; margin: 16px; background: #fafafa; color: #111; }
section { margin-bottom: 24px; }
table { border-collapse: separate; border-spacing: 3px; }
th { text-align: left; font-weight: normal; color: #555; padding: 2px 8px; }
td.cpu { min-width: 110px; height: 34px; padding: 2px 8px; border: 1px solid #999; font-size: 12px; }
td.cpu b { font-size: 14px; }
.legend span.swatch { display: inline-block; width: 40px; height: 20px; border: 1px solid #999;
  vertical-align: middle; margin-right: 6px; }
.legend div { margin: 3px 0; }
"""


def render_html(pic: Mapping, title: str = "numa-pin: node map") -> str:
    """The picture as one standalone HTML page: every CPU is a ``<td class="cpu">`` with
    ``data-cpu`` and ``data-holder``, coloured as the legend says; no script, no external asset."""
    legend = {e["label"]: e for e in pic["legend"]}
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', f"<title>{escape(title)}</title>",
           f"<style>{_STYLE}</style></head><body>", f"<h1>{escape(title)}</h1>"]

    def cell(cpu: int, holder: str) -> str:
        bg = legend[holder]["colour"] if holder in legend else "#ffffff"
        fg = "#ffffff" if holder in legend and legend[holder]["kind"] in ("grant", RESERVED, OFFLINE) else "#000000"
        return (f'<td class="cpu" data-cpu="{cpu}" data-holder="{escape(holder)}" style="background:{bg};color:{fg}">'
                f"<b>{cpu}</b> {escape(holder)}</td>")

    for node in pic["nodes"]:
        out.append(f'<section class="node" data-node="{node["node"]}"><h2>NUMA node {node["node"]}</h2>')
        out.append(f"<p>CPUs {escape(node['cpus'] or '-')}</p>")
        if node["memory"]:
            out.append("<p>" + "<br>".join(
                f"{escape(m['resource'])}: {human_bytes(m['used'])} used of {human_bytes(m['allocatable'])} "
                f"allocatable ({human_bytes(m['capacity'])} in all)" for m in node["memory"]) + "</p>")
        threads = max((len(r["cpus"]) for r in node["cores"]), default=0)
        out.append("<table><tr><th>core</th>" + "".join(f"<th>thread {t}</th>" for t in range(threads)) + "</tr>")
        for row in node["cores"]:
            out.append(f"<tr><th>{escape(row['core'])}</th>" + "".join(cell(c, h) for c, h in row["cpus"]) + "</tr>")
        for chunk in _chunks(node["offline"], max(threads, 4)):
            out.append("<tr><th>offline</th>" + "".join(cell(c, h) for c, h in chunk) + "</tr>")
        out.append("</table>")
        out += _device_html(node["devices"])
        out.append("</section>")
    elsewhere = pic["elsewhere"]
    if elsewhere["offline"] or elsewhere["devices"]:
        out.append('<section class="node" data-node="none"><h2>No NUMA node</h2><table><tr>'
                   + "".join(cell(c, h) for c, h in elsewhere["offline"]) + "</tr></table>")
        out += _device_html(elsewhere["devices"])
        out.append("</section>")
    out.append('<section class="legend"><h2>Legend</h2>')
    out += [f'<div data-holder="{escape(e["label"])}"><span class="swatch" style="background:{e["colour"]}"></span>'
            f"{escape(e['label'])}: {escape(e['what'])}</div>" for e in pic["legend"]]
    out.append("</section></body></html>")
    return "\n".join(out) + "\n"


def _device_html(rows: Sequence[Mapping]) -> list[str]:
    if not rows:
        return []
    return ["<table><tr><th>device</th><th>resource</th><th>holder</th></tr>"] + [
        f'<tr class="device" data-device="{escape(d["id"])}" data-holder="{escape(d["holder"])}"><td>'
        f"{escape(d['id'])}</td><td>{escape(d['resource'])}</td><td>{escape(d['holder'])}"
        + ("" if d["healthy"] else " (unhealthy)") + "</td></tr>" for d in rows] + ["</table>"]


__all__ = ["COLUMNS", "COLOURS", "GRANT_COLOURS", "ISOLATED", "OFFLINE", "RESERVED", "SHARED", "picture", "render_html",
           "render_text"]
