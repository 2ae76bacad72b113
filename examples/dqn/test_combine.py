"""Tests of combine.py (standard library only: `python3 -m unittest examples/dqn/test_combine.py`)."""

import io
import json
import math
import os
import sys
import tempfile
import unittest
from contextlib import redirect_stderr, redirect_stdout

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import combine as C  # noqa: E402

RUST = {"device": "GPU X", "batch": 16384, "eager_ms": 3.0, "one_stream_graph_ms": 2.6,
        "stepgraph_graph_ms": 2.4, "critical_path_bound_ms": 1.3, "work_bound_ms": 2.2,
        "breakdown": "trunk=0.1"}
TORCH = {"device": "GPU X", "sizes": {"B": 16384},
         "median_ms": {"eager": 11.0, "compile:reduce-overhead": 8.0}}


class Combine(unittest.TestCase):
    def run_main(self, rust, torch_bench):
        with tempfile.TemporaryDirectory() as d:
            paths = [os.path.join(d, n) for n in ("r.json", "t.json", "out.json")]
            for p, obj in zip(paths, (rust, torch_bench)):
                with open(p, "w") as f:
                    json.dump(obj, f)
            out, err = io.StringIO(), io.StringIO()
            with redirect_stdout(out), redirect_stderr(err):
                rc = C.main([paths[0], paths[1], "--json", paths[2]])
            res = None
            if rc == 0:
                with open(paths[2]) as f:
                    res = json.load(f)
        return rc, res, out.getvalue(), err.getvalue()

    def test_ratios_are_taken_against_the_larger_bound(self):
        rc, res, out, _ = self.run_main(RUST, TORCH)
        self.assertEqual(rc, 0)
        r = res["ratios"]
        self.assertEqual(r["larger_bound"], "work (w)")
        self.assertTrue(math.isclose(r["c_over_larger_bound"], 2.4 / 2.2))
        self.assertTrue(math.isclose(r["share_of_allowed_saving_taken"], 0.2 / 0.4))
        self.assertEqual(r["best_pytorch_variant"], "compile:reduce-overhead")
        self.assertTrue(math.isclose(r["best_pytorch_over_c"], 8.0 / 2.4))
        self.assertIn("| (w) work bound | 2.200 | (c)/(w) = 1.091 |", out)

    def test_the_grid_share_bound_is_reported_beside_the_wave_bound(self):
        rc, res, out, _ = self.run_main(dict(RUST, grid_work_bound_ms=2.25), TORCH)
        self.assertEqual(rc, 0)
        r = res["ratios"]
        self.assertTrue(math.isclose(r["c_over_larger_bound"], 2.4 / 2.2))
        self.assertTrue(math.isclose(r["c_over_larger_grid_bound"], 2.4 / 2.25))
        self.assertIn("(c) against max((d), (w')), the bound with each kernel's grid share, "
                      "2.250 ms: 1.067", out)
        # Without (w') in the record there is no such ratio.
        rc, res, out, _ = self.run_main(RUST, TORCH)
        self.assertIsNone(res["ratios"]["c_over_larger_grid_bound"])
        self.assertNotIn("max((d), (w'))", out)

    def test_the_chains_bound_is_reported_when_the_record_has_it(self):
        rc, res, out, _ = self.run_main(dict(RUST, chains_bound_ms=2.3), TORCH)
        self.assertEqual(rc, 0)
        self.assertTrue(math.isclose(res["ratios"]["c_over_chains_bound"], 2.4 / 2.3))
        self.assertIn("| (p) chains and the work between them | 2.300 | (c)/(p) = 1.043 |", out)
        # Records before (p), and a bench that could not measure it (0), have no such row.
        for rust in (RUST, dict(RUST, chains_bound_ms=0.0)):
            rc, res, out, _ = self.run_main(rust, TORCH)
            self.assertIsNone(res["ratios"]["c_over_chains_bound"])
            self.assertNotIn("(p)", out)

    def test_the_critical_path_is_the_bound_when_it_is_larger(self):
        rc, res, _, _ = self.run_main(dict(RUST, critical_path_bound_ms=2.3), TORCH)
        self.assertEqual(rc, 0)
        self.assertEqual(res["ratios"]["larger_bound"], "critical path (d)")
        self.assertTrue(math.isclose(res["ratios"]["c_over_larger_bound"], 2.4 / 2.3))

    def test_results_from_two_devices_or_batches_are_refused(self):
        rc, _, _, err = self.run_main(RUST, dict(TORCH, device="GPU Y"))
        self.assertEqual(rc, 1)
        self.assertIn("different devices: 'GPU X' and 'GPU Y'", err)
        rc, _, _, err = self.run_main(RUST, dict(TORCH, sizes={"B": 512}))
        self.assertEqual(rc, 1)
        self.assertIn("different batches: 16384 and 512", err)

    def test_a_missing_key_is_named(self):
        rust = {k: v for k, v in RUST.items() if k != "work_bound_ms"}
        rc, _, _, err = self.run_main(rust, TORCH)
        self.assertEqual(rc, 1)
        self.assertIn("dqn_bench.json: expected key 'work_bound_ms', not found", err)


if __name__ == "__main__":
    unittest.main()
