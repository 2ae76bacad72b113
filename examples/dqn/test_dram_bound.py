"""Tests of dram_bound.py (standard library only)."""

import math
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dram_bound as D  # noqa: E402

HEADER = '"ID","Kernel Name","Grid Size","Block Size","Metric Name","Metric Unit","Metric Value"'


def ncu_rows(kernels):
    lines = ["==PROF== Connected to process", HEADER]
    for i, (name, grid, read, write, ns) in enumerate(kernels):
        for metric, value in (("dram__bytes_read.sum", read), ("dram__bytes_write.sum", write),
                              ("gpu__time_duration.sum", ns)):
            lines.append(f'"{i}","{name}","({grid}, 1, 1)","(256, 1, 1)","{metric}","byte","{value:,}"')
    return lines


BENCH = {"stepgraph_graph_ms": 1.0, "kernels": [
    {"op": "a", "name": "stream_copy", "blocks": 16, "share": 0.1, "alone_ms": 0.1},
    {"op": "b", "name": "gemm", "blocks": 1000, "share": 1.0, "alone_ms": 0.2},
]}


class DramBound(unittest.TestCase):
    def test_a_kernel_is_charged_its_larger_share(self):
        # A warm-up kernel before the replay is skipped: the replay is the last two.
        ks = D.read_ncu(ncu_rows([("warmup", 4, 1, 1, 1000),
                                  ("stream_copy", 16, 2e8, 1e8, 100000),
                                  ("gemm", 1000, 1e7, 0, 200000)]))
        self.assertEqual(len(ks), 3)
        self.assertEqual(ks[1]["bytes"], 3e8)
        res = D.bound(BENCH, ks, 3000.0)
        # stream_copy: 3e8 bytes in 0.1 ms is the whole 3000 GB/s: DRAM share 1, not 0.1.
        r0, r1 = res["kernels"]
        self.assertTrue(math.isclose(r0["dram_share"], 1.0))
        self.assertTrue(math.isclose(res["sm_bound_ms"], 0.1 * 0.1 + 0.2))
        self.assertTrue(math.isclose(res["combined_bound_ms"], 0.1 + 0.2))
        self.assertTrue(math.isclose(r1["dram_share"], 1e7 / (0.2e-3 * 3e12)))

    def test_a_mismatched_kernel_is_named(self):
        ks = D.read_ncu(ncu_rows([("stream_copy", 16, 1, 1, 1), ("other", 1000, 1, 1, 1)]))
        with self.assertRaisesRegex(ValueError, "kernel 1 \\(op b\\).*gemm.*other"):
            D.bound(BENCH, ks, 3000.0)

    def test_too_few_kernels_are_an_error(self):
        ks = D.read_ncu(ncu_rows([("gemm", 1000, 1, 1, 1)]))
        with self.assertRaisesRegex(ValueError, "expected at least 2 kernels"):
            D.bound(BENCH, ks, 3000.0)


if __name__ == "__main__":
    unittest.main()
