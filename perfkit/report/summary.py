"""What the console shows at the end of `perfkit probe`, as lines; the CLI prints them."""

from __future__ import annotations

from perfkit.measure.probe import ServerProbe


def render_probe(result: ServerProbe) -> list[str]:
    lines = [
        f"server   {result.name} {result.version} at {result.url}",
        f"health   live={result.live} ready={result.ready}",
        f"features {', '.join(result.extensions) or '-'}",
        "",
        f"{'model':<16} {'versions':>8} {'inputs':<30} {'ok':>7} {'p50 ms':>8} {'max ms':>8}",
    ]
    for m in result.models:
        ins = " ".join(f"{k}{v}" for k, v in m.input_shapes.items())
        ok = f"{m.requests - m.errors}/{m.requests}"
        lines.append(f"{m.model:<16} {m.versions:>8} {ins:<30} {ok:>7} {m.p50_ms:>8.3f} {m.max_ms:>8.3f}")
        if m.error:
            lines.append(f"  error: {m.error}")
    return lines
