"""Other planners' predictions of bundled rows, beside Piper's (validation/peers.csv).

A peer's accuracy is usually published on its own points and with its own inputs; this puts
its prediction of a row next to Piper's prediction of the same row, against the same published
figure, so the two errors compare like for like. Each peer row carries the peer's version and
how it was run (its `source`); the peers' code is not bundled, only what it printed.
"""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from .validate import Result, data_path

BREAKDOWN = ("bubble_s", "tp_comm_exposed_s", "pp_comm_exposed_s")


def peers_path() -> Path:
    return data_path().parent / "peers.csv"


def read_peers(path: Path | None = None) -> list[dict]:
    """The peer table's rows: id, peer, metric, predicted (float) and source, with each part of
    BREAKDOWN as a float where given (seconds a step, the peer's own split of its prediction)."""
    path = path or peers_path()
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        r["predicted"] = float(r["predicted"])
        for k in BREAKDOWN:
            r[k] = float(r[k]) if r.get(k) else None
    return rows


def beside(results: list[Result], peers: list[dict] | None = None) -> dict:
    """{"rows": [...], "peers": {name: summary}} for the priced rows a peer also predicted, in
    the same metric: each row's published figure, the peer's prediction and error, Piper's
    prediction and error (%, predicted / published - 1); each peer's summary holds the mean and
    max |error| of both over the rows they share. Rows Piper could not price are left out."""
    peers = read_peers() if peers is None else peers
    by_id = {r.id: r for r in results if np.isfinite(r.predicted)}
    rows = []
    for p in peers:
        r = by_id.get(p["id"])
        if r is None or r.metric != p["metric"]:
            continue
        rows.append(dict(id=r.id, peer=p["peer"], metric=r.metric, published=r.published,
                         peer_predicted=p["predicted"], peer_error_pct=100.0 * (p["predicted"] / r.published - 1),
                         predicted=r.predicted, error_pct=r.error_pct, source=p["source"],
                         **{f"peer_{k}": p[k] for k in BREAKDOWN}))
    summ = {}
    for name in sorted({r["peer"] for r in rows}):
        mine = [r for r in rows if r["peer"] == name]
        pe, me = (np.abs([r[k] for r in mine]) for k in ("peer_error_pct", "error_pct"))
        summ[name] = dict(rows=len(mine), peer_mape=float(pe.mean()), peer_max_abs_pct=float(pe.max()),
                          mape=float(me.mean()), max_abs_pct=float(me.max()))
    return {"rows": rows, "peers": summ}
