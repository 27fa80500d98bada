#!/usr/bin/python3
"""experiments/report/live_divergence.py on two small hand-written runs: it names the first
request routed differently (in the first run's send order, not by request id), splits the hit
ratio there, and sets each engine's host-memory tokens against the blocks its tiers counted."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "experiments", "report", "live_divergence.py")


def request(rid, session, turn, sent, instance, prompt, cached, cpu=0):
    return {"request_id": rid, "session_id": session, "turn": turn, "sent_s": sent, "ok": True,
            "instance": instance, "prompt_tokens": prompt, "cached_tokens": cached,
            "cpu_cached_tokens": cpu, "disk_cached_tokens": 0}


def write_rep(path, rows, scores, onboarded):
    os.makedirs(path)
    with open(os.path.join(path, "results.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    with open(os.path.join(path, "decisions.jsonl"), "w") as f:
        for session, s in scores:
            f.write(json.dumps({"session": session, "attempt": 1, "scores": s}) + "\n")
    for engine, blocks in onboarded.items():
        with open(os.path.join(path, f"engine_{engine}.metrics"), "w") as f:
            f.write('# TYPE kvfabric_tier_onboarded_blocks_total counter\n'
                    f'kvfabric_tier_onboarded_blocks_total{{tier="host"}} {blocks}\n'
                    'kvfabric_tier_onboarded_blocks_total{tier="disk"} 0\n')


def run(a, b):
    out = subprocess.run([sys.executable, SCRIPT, a, b], capture_output=True, text=True)
    if out.returncode != 0:
        raise AssertionError(out.stderr)
    return out.stdout


class LiveDivergenceTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        # Send order s2#1, s1#1, s1#2: the ids sort differently, the report must not.
        self.common = [request("s2#1", "s2", 1, 1.0, "0", 1000, 0),
                       request("s1#1", "s1", 1, 2.0, "1", 800, 0)]
        self.scores = [("s2", {"0": 0, "1": 0}), ("s1", {"0": 9, "1": 0})]

    def rep(self, name, rows, scores, onboarded):
        path = os.path.join(self.tmp.name, name)
        write_rep(path, rows, scores, onboarded)
        return path

    def test_names_the_first_different_decision_and_checks_the_counts(self):
        a = self.rep("a", self.common + [request("s1#2", "s1", 2, 3.0, "1", 960, 800, cpu=160)],
                     self.scores + [("s1", {"0": 5, "1": 7})], {"0": 0, "1": 10})
        b = self.rep("b", self.common + [request("s1#2", "s1", 2, 3.2, "0", 960, 800, cpu=320)],
                     self.scores + [("s1", {"0": 0, "1": 7})], {"0": 19, "1": 0})
        out = run(a, b)
        self.assertIn("first routed differently: #2 s1#2", out)
        self.assertIn("A sent 3.000 s -> instance 1, B sent 3.200 s -> 0", out)
        self.assertIn("B's scores at that decision: {'0': 0, '1': 7}", out)
        self.assertIn("A before: 2 requests, hit 0.00%", out)
        self.assertIn("A after:  1 requests, hit 83.33% (GPU 66.67 / host 16.67 / disk 0.00)", out)
        self.assertIn("B after:  1 requests, hit 83.33% (GPU 50.00 / host 33.33 / disk 0.00)", out)
        self.assertIn("s1: +160 tokens", out)
        self.assertIn("A engine 1: 10 blocks in the results, 10 onboarded", out)
        # 320 tokens are 20 blocks; the engine counted 19: the mismatch shows.
        self.assertIn("B engine 0: 20 blocks in the results, 19 onboarded", out)

    def test_identical_routing(self):
        rows = self.common + [request("s1#2", "s1", 2, 3.0, "1", 960, 800)]
        a = self.rep("a", rows, self.scores, {})
        b = self.rep("b", rows, self.scores, {})
        out = run(a, b)
        self.assertIn("every request went to the same instance in both runs", out)
        self.assertIn("A before: 3 requests", out)
        self.assertIn("engine 1: 0 blocks in the results, n/a onboarded", out)

    def test_a_folder_without_results_is_named(self):
        a = self.rep("a", self.common, self.scores, {})
        out = subprocess.run([sys.executable, SCRIPT, a, os.path.join(self.tmp.name, "nope")],
                             capture_output=True, text=True)
        self.assertNotEqual(out.returncode, 0)
        self.assertIn("no results.jsonl", out.stderr)


if __name__ == "__main__":
    unittest.main()
