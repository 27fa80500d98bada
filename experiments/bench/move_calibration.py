#!/usr/bin/python3
"""Predicted against measured KV-move times from decision logs (docs/benchmarks.md, "KV move
cost calibration").

Usage: move_calibration.py DECISIONS.jsonl [...]
Reads every record whose `move` object has a measured time and prints, per file, the number
of moves and the median and p90 of measured / predicted (the corrected prediction) and of
measured / model (the cost model alone), plus the mean predicted and realised gain against
computing locally. A ratio of 1 is a perfect prediction; the goal is within 1.2x.
"""
import json
import sys

import numpy as np


def summarise(path):
    corrected, model, predicted_gain, realised_gain = [], [], [], []
    with open(path) as f:
        for line in f:
            move = json.loads(line).get("move")
            if not move or move.get("measured_s") is None:
                continue
            measured = move["measured_s"]
            corrected.append(measured / move["predicted_s"])
            model.append(measured / move["model_s"])
            if move.get("predicted_gain_s") is not None:
                predicted_gain.append(move["predicted_gain_s"])
                realised_gain.append(move["realised_gain_s"])
    if not corrected:
        return f"{path}: no measured moves"
    c, m = np.array(corrected), np.array(model)

    def fold(r):  # a ratio's distance from 1 either way
        return np.maximum(r, 1 / r)

    return (f"{path}: moves={len(c)} measured/predicted median={np.median(c):.3f} "
            f"p90(off by)={np.quantile(fold(c), 0.9):.3f} | measured/model "
            f"median={np.median(m):.3f} p90(off by)={np.quantile(fold(m), 0.9):.3f} | gain "
            f"predicted={np.mean(predicted_gain) if predicted_gain else float('nan'):.3f}s "
            f"realised={np.mean(realised_gain) if realised_gain else float('nan'):.3f}s")


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if len(sys.argv) >= 2 else 2)
    for p in sys.argv[1:]:
        print(summarise(p))
