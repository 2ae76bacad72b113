//! CPU tests of the wrappers' checks, plans and registry (the GPU ones are in
//! `tests/gpu_dqn.rs`).

use super::*;
use stepgraph_kernels::launch::elementwise_config;

/// The kernels the wrappers launch, module by module: what stepgraph-build read from
/// `cuda/*.cu`, in file and source order.
#[test]
fn the_registry_has_every_kernel_of_the_step() {
    let names: Vec<(&str, &str)> = KernelId::ALL
        .iter()
        .map(|k| (k.module().name(), k.name()))
        .collect();
    let want = [
        ("attention", "attention_forward"),
        ("attention", "attention_backward"),
        ("attention", "attn_pool_loss"),
        ("attention", "attn_pool_finish"),
        ("attention_fused", "attention_fused_fold"),
        ("attention_fused", "attention_fused"),
        ("attention_fused", "attention_fused_sums"),
        ("attention_fused", "attention_fused_grads"),
        ("heads", "glu_forward"),
        ("heads", "glu_backward"),
        ("heads", "branch_head_forward"),
        ("heads", "branch_head_backward_partial"),
        ("heads", "branch_head_backward_finish"),
        ("heads", "ddqn_target"),
        ("heads", "dueling_losses"),
        ("heads", "expectile_loss"),
        ("heads", "expectile_head_partial"),
        ("heads", "expectile_head_finish"),
        ("heads", "trunk_grad_join_partial"),
        ("heads", "trunk_grad_join_finish"),
        ("heads", "trunk_l1_grad_partial"),
        ("heads", "trunk_l1_grad_finish"),
        ("iqn", "iqn_cos_features"),
        ("iqn", "iqn_forward_backward_v2"),
        ("iqn", "iqn_forward_backward_v4"),
        ("iqn", "iqn_forward_backward_generic"),
        ("iqn", "iqn_finish"),
        ("iqn", "iqn_fused"),
        ("iqn", "iqn_fused_finish"),
        ("iqn", "iqn_wgmma"),
        ("replay", "replay_draw"),
        ("replay", "replay_advance"),
        ("replay", "replay_gather"),
        ("replay", "replay_gather_rows4"),
        ("replay", "replay_gather_rows"),
        ("replay", "replay_fill_normal"),
        ("replay", "replay_fill_actions"),
        ("replay", "replay_fill_bernoulli"),
        ("watch", "watch_step"),
    ];
    assert_eq!(names, want);
    // A struct passed by value: its size is the PTX's (eight device addresses).
    let adv2 = KernelId::DdqnTarget.decl().params[1];
    assert_eq!(
        (adv2.name, adv2.c_type, adv2.size),
        ("adv2", "const BranchIn", 64)
    );
}

/// `#define NAME value` lines of a file in `cuda/`.
fn cuda_defines(file: &str) -> std::collections::HashMap<String, String> {
    let path = format!("{}/cuda/{file}", env!("CARGO_MANIFEST_DIR"));
    stepgraph_testkit::cuda_defines(&path).unwrap()
}

#[test]
fn the_watch_words_match_the_cuda_file() {
    let watch = cuda_defines("watch.cu");
    for (name, value) in [
        ("WATCH_REPLAYS", Watch::REPLAYS),
        ("WATCH_BAD_REPLAY", Watch::BAD_REPLAY),
        ("WATCH_LOSSES", Watch::LOSSES),
        ("WATCH_SQ_NORM", Watch::SQ_NORM),
        ("WATCH_BAD_LOSSES", Watch::BAD_LOSSES),
        ("WATCH_BAD_SQ_NORM", Watch::BAD_SQ_NORM),
        ("WATCH_TENSORS", Watch::HEADER),
        ("WATCH_LOSS_COUNT", 7),
        ("WATCH_TABLE_WORDS", stepgraph_kernels::PARAM_TABLE_WORDS),
    ] {
        assert_eq!(watch[name], value.to_string(), "{name}");
    }
}

#[test]
fn a_watch_read_back_parses_by_its_words_and_refuses_another_length() {
    let mut words = vec![0u32; Watch::words(2)];
    words[0] = 9;
    words[2] = 1.5f32.to_bits();
    words[9] = 4.0f32.to_bits();
    let w = Watch::parse(&words, 2).unwrap();
    assert_eq!(
        (w.replays, w.losses[0], w.sq_norm, w.bad),
        (9, 1.5, 4.0, None)
    );
    words[1] = 7;
    words[10] = f32::NAN.to_bits();
    words[Watch::HEADER + 2] = 3;
    let bad = Watch::parse(&words, 2).unwrap().bad.unwrap();
    assert_eq!(
        (bad.replay, bad.non_finite.clone()),
        (7, vec![(0, 0), (3, 0)])
    );
    assert!(bad.losses[0].is_nan());
    assert!(Watch::parse(&words[1..], 2).is_err());
}

#[test]
fn loss_slots_and_branch_tables_match_the_cuda_header() {
    let defines = cuda_defines("dqn.cuh");
    for slot in LossSlot::ALL {
        assert_eq!(
            defines.get(slot.macro_name()).map(String::as_str),
            Some(slot.index().to_string().as_str()),
            "{slot:?}"
        );
    }
    assert_eq!(defines["LOSS_SLOT_COUNT"], LOSS_SLOTS.to_string());
    assert_eq!(defines["MAX_BRANCHES"], MAX_BRANCHES.to_string());
    let mut indices: Vec<usize> = LossSlot::ALL.iter().map(|s| s.index()).collect();
    indices.dedup();
    assert_eq!(indices.len(), LossSlot::ALL.len());
    assert!(indices.iter().all(|&i| i < LOSS_SLOTS));
}

#[test]
fn iqn_constants_match_the_cuda_source() {
    let iqn = cuda_defines("iqn.cu");
    assert_eq!(iqn["IQN_WARPS"], IQN_WARPS.to_string());
    assert_eq!(iqn["IQN_FUSED_MAX_WARPS"], IQN_FUSED_MAX_WARPS.to_string());
    assert_eq!(iqn["IQN_FUSED_C"], IQN_FUSED_MAX_COSINES.to_string());
    let (n, c, h) = IQN_WGMMA_SIZES;
    assert_eq!(iqn["IQN_WG_N"], n.to_string());
    assert_eq!(iqn["IQN_WG_C"], c.to_string());
    assert_eq!(iqn["IQN_WG_H"], h.to_string());
    assert_eq!(iqn["IQN_WG_THREADS"], "256");
    assert_eq!(iqn["IQN_WG_SMEM"], IQN_WGMMA_SHARED_BYTES.to_string());
}

/// The limits the head kernels' register arrays and grids are sized for: a Rust limit
/// above the kernel's would drop units or actions without an error.
#[test]
fn head_kernel_limits_match_the_cuda_source() {
    let heads = cuda_defines("heads.cu");
    let num = |k: &str| heads[k].parse::<usize>().unwrap();
    assert_eq!(num("BRANCH_HEAD_MAX_A"), BRANCH_HEAD_MAX_ACTIONS);
    assert_eq!(32 * num("BRANCH_HEAD_MAX_UNITS"), BRANCH_HEAD_MAX_GLU);
    assert_eq!(num("BRANCH_HEAD_FORWARD_ROWS"), BRANCH_HEAD_FORWARD_ROWS);
    assert_eq!(
        32 * num("EXPECTILE_HEAD_MAX_UNITS"),
        EXPECTILE_HEAD_MAX_HIDDEN
    );
    assert_eq!(num("TL1_MAX_H"), TRUNK_L1_MAX_HIDDEN);
    assert_eq!(num("TL1_MAX_S"), TRUNK_L1_MAX_STATE);
    assert_eq!(num("TL1_ROWS"), TRUNK_L1_ROWS);
    // 8 warps of 16 units a block, staged by 32 threads of 4 columns; two blocks.
    assert_eq!(num("TL1_UNITS"), 8 * 16);
    assert_eq!(num("TL1_UNITS"), 32 * 4);
    assert_eq!(TRUNK_L1_MAX_HIDDEN, 2 * num("TL1_UNITS"));
}

/// Each row in exactly one chunk, chunks a multiple of the staged rows, at most 256.
#[test]
fn trunk_l1_grad_plan_covers_every_row_once() {
    for rows in [1, 31, 32, 33, 1001, 1024, 16384, 32768, 65537, 1 << 20] {
        let (chunks, per_chunk) = trunk_l1_grad_plan(rows);
        assert!(
            chunks * per_chunk >= rows,
            "{rows}: rows past the last chunk"
        );
        assert!((chunks - 1) * per_chunk < rows, "{rows}: an empty chunk");
        assert!(
            chunks <= 256 && per_chunk % TRUNK_L1_ROWS == 0,
            "{rows}: {per_chunk}"
        );
    }
    assert_eq!(trunk_l1_grad_plan(16384), (128, 128));
}

#[test]
fn trunk_l1_grad_takes_what_its_tiles_hold() {
    let d = |batch, hidden, state| TrunkL1Dims {
        batch,
        hidden,
        state,
    };
    assert!(d(16384, 256, 64).supported() && d(1, 4, 4).supported());
    for bad in [
        d(0, 256, 64),
        d(8, 260, 64),
        d(8, 256, 68),
        d(8, 254, 64),
        d(8, 256, 6),
    ] {
        assert!(!bad.supported(), "{bad:?}");
    }
}

/// Each row in exactly one chunk, whatever the batch; at most 1024 chunks, each of
/// about 64 rows until the cap makes them longer.
#[test]
fn warp_row_plan_covers_every_row_once() {
    for rows in [1, 63, 64, 65, 1001, 16384, 65536, 65537, 70000, 1 << 20] {
        let (chunks, per_chunk) = warp_row_plan(rows);
        assert!(
            chunks * per_chunk >= rows,
            "{rows}: rows past the last chunk"
        );
        assert!((chunks - 1) * per_chunk < rows, "{rows}: an empty chunk");
        assert!(chunks <= 1024, "{rows}: {chunks} chunks");
        assert!(
            per_chunk <= 64 || rows > 64 * 1024,
            "{rows}: {per_chunk} rows a chunk"
        );
    }
    assert_eq!(warp_row_plan(16384), (256, 64));
}

#[test]
fn iqn_plan_picks_the_kernel_by_hidden_width() {
    let dims = |batch, quantiles, hidden| IqnDims {
        batch,
        quantiles,
        hidden,
    };
    // The step's sizes: the 2-vector kernel, 8 samples per block up to IQN_BLOCKS.
    let plan = iqn_plan(dims(16384, 32, 256)).unwrap();
    assert_eq!(plan.kernel, KernelId::IqnForwardBackwardV2);
    assert_eq!(plan.config.grid_dim, (IQN_BLOCKS, 1, 1));
    assert_eq!(plan.config.block_dim, (256, 1, 1));
    assert_eq!(plan.config.shared_mem_bytes, 0);
    assert_eq!(plan.rows, IQN_BLOCKS);
    assert_eq!(dims(16384, 32, 256).scratch_len(), 1024 * 514);

    let plan = iqn_plan(dims(20, 5, 200)).unwrap();
    assert_eq!(plan.kernel, KernelId::IqnForwardBackwardV2);
    assert_eq!(plan.config.grid_dim, (3, 1, 1));
    assert_eq!(
        iqn_plan(dims(20, 5, 260)).unwrap().kernel,
        KernelId::IqnForwardBackwardV4
    );
    assert_eq!(
        iqn_plan(dims(20, 5, 512)).unwrap().kernel,
        KernelId::IqnForwardBackwardV4
    );
    for hidden in [37, 258, 516, 1024] {
        let plan = iqn_plan(dims(3000, 7, hidden)).unwrap();
        assert_eq!(
            plan.kernel,
            KernelId::IqnForwardBackwardGeneric,
            "H = {hidden}"
        );
        assert_eq!(plan.config.grid_dim, (1024, 1, 1));
        assert_eq!(plan.config.block_dim, (32, 1, 1));
        assert_eq!(plan.config.shared_mem_bytes, 7 * 4);
        assert_eq!(plan.scratch_len, 1024 * (2 * hidden + 2));
    }
    assert!(
        iqn_plan(dims(4, 20_000, 37)).is_err(),
        "dzq does not fit shared memory"
    );
    assert!(iqn_plan(dims(0, 32, 256)).is_err());
    assert_eq!(dims(4, 0, 256).scratch_len(), 0);
}

#[test]
fn finish_rows_wider_than_32_bits_are_refused_not_wrapped() {
    // H = 2^31 fits the kernels' 32-bit sizes, and B N H too; 2 H + 2 does not.
    let dims = IqnDims {
        batch: 1,
        quantiles: 1,
        hidden: 1 << 31,
    };
    let e = iqn_plan(dims).unwrap_err().to_string();
    assert!(
        e.starts_with(
            "iqn_forward_backward: a partial row (2 H + 2 columns) has 4294967298 elements"
        ),
        "{e}"
    );
    assert_eq!(dims.scratch_len(), 0);
    let attn = |width| AttnPoolDims {
        batch: 4,
        window: 2,
        width,
    };
    assert_eq!(attn(64).cols().unwrap(), 66);
    let e = attn(u32::MAX as usize).cols().unwrap_err().to_string();
    assert!(
        e.starts_with("attn_pool_loss: a partial row (E + 2 columns) has 4294967297 elements"),
        "{e}"
    );
    assert_eq!(attn(usize::MAX).scratch_len(), usize::MAX);
}

#[test]
fn iqn_fused_plan_sizes_the_grid_and_the_scratch() {
    let dims = |batch, quantiles, hidden, cosines| IqnFusedDims {
        batch,
        quantiles,
        hidden,
        cosines,
        sms: PERSISTENT_SMS,
    };
    // The step's sizes: 16 warps, one block per SM of the H100.
    let step = dims(16384, 32, 256, 64);
    let plan = iqn_fused_plan(step).unwrap();
    let wave = PERSISTENT_SMS * IQN_FUSED_WAVES;
    assert_eq!(plan.config.grid_dim, (wave, 1, 1));
    assert_eq!(plan.config.block_dim, (512, 1, 1));
    assert_eq!(plan.config.shared_mem_bytes, 0, "static shared memory only");
    assert_eq!(plan.rows, wave);
    let row = 2 * 256 + 2 + 256 * 64;
    assert_eq!(step.scratch_len(), wave as usize * row);
    assert!(step.supported());
    assert_eq!(
        step.unfused(),
        IqnDims {
            batch: 16384,
            quantiles: 32,
            hidden: 256
        }
    );

    // Ragged H: a partial last warp.
    let plan = iqn_fused_plan(dims(3000, 7, 200, 40)).unwrap();
    assert_eq!(plan.config.grid_dim, (wave, 1, 1));
    assert_eq!(plan.config.block_dim, (32 * 13, 1, 1));
    assert_eq!(plan.scratch_len, wave as usize * (2 * 200 + 2 + 200 * 40));
    // Fewer samples than blocks: one block each.
    let plan = iqn_fused_plan(dims(5, 33, 256, 64)).unwrap();
    assert_eq!(plan.config.grid_dim, (5, 1, 1));
    assert_eq!(plan.scratch_len, 5 * row);
    // Small H: several blocks share an SM, as many as shared memory allows.
    let plan = iqn_fused_plan(dims(16384, 32, 64, 64)).unwrap();
    assert_eq!(plan.config.block_dim, (128, 1, 1));
    assert_eq!(plan.config.grid_dim, (wave * 4, 1, 1));
    let plan = iqn_fused_plan(dims(16384, 32, 16, 1)).unwrap();
    assert_eq!(plan.config.block_dim, (32, 1, 1));
    assert_eq!(
        plan.config.grid_dim,
        (wave * IQN_FUSED_SMEM_BLOCKS_PER_SM, 1, 1)
    );

    // Outside the kernel's sizes: an error that names what was expected and found.
    let err = iqn_fused_plan(dims(16, 32, 257, 64)).unwrap_err();
    assert!(
        err.to_string().contains("at most 256 hidden units") && err.to_string().contains("H = 257"),
        "{err}"
    );
    let err = iqn_fused_plan(dims(16, 32, 256, 65)).unwrap_err();
    assert!(
        err.to_string().contains("at most 64 cosine features")
            && err.to_string().contains("C = 65"),
        "{err}"
    );
    for bad in [
        dims(0, 32, 256, 64),
        dims(16, 0, 256, 64),
        dims(16, 32, 0, 64),
        dims(16, 32, 256, 0),
        dims(1 << 30, 8, 16, 8),
    ] {
        assert!(!bad.supported(), "{bad:?}");
        assert_eq!(bad.scratch_len(), 0, "{bad:?}");
    }
}

#[test]
fn attention_fused_constants_match_the_cuda_source() {
    let af = cuda_defines("attention_fused.cu");
    let (s, w, e, hh) = ATTENTION_FUSED_SIZES;
    assert_eq!(af["AF_S"], s.to_string());
    assert_eq!(af["AF_W"], w.to_string());
    assert_eq!(af["AF_E"], e.to_string());
    assert_eq!(af["AF_HEADS"], hh.to_string());
    assert_eq!(af["AF_SAMPLES"], ATTENTION_FUSED_TILE.to_string());
    assert_eq!(af["AF_THREADS"], "256");
    assert_eq!(
        af["AF_SMEM_BYTES"],
        ATTENTION_FUSED_SHARED_BYTES.to_string()
    );
    assert_eq!(af["AF_ROW_LEN"], ATTENTION_FUSED_ROW_LEN.to_string());
    assert_eq!(
        af["AF_GRADS_BLOCKS"],
        ATTENTION_FUSED_GRADS_BLOCKS.to_string()
    );
    assert_eq!(af["AF_FOLD_LEN"], ATTENTION_FUSED_FOLD_LEN.to_string());
    assert_eq!(
        af["AF_FOLD_BLOCKS"],
        ATTENTION_FUSED_FOLD_BLOCKS.to_string()
    );
    // Within Hopper's opt-in limit of 227 KB a block.
    const { assert!(ATTENTION_FUSED_SHARED_BYTES <= 227 * 1024) };
}

#[test]
fn the_persistent_heads_hold_at_most_their_sms() {
    let attn = AttnFusedDims {
        batch: 16384,
        state: 64,
        window: 8,
        width: 64,
        heads: 4,
        sms: 66,
    };
    let iqn = IqnFusedDims {
        batch: 16384,
        quantiles: 32,
        hidden: 256,
        cosines: 64,
        sms: 116,
    };
    let plan = attention_fused_plan(attn).unwrap();
    assert_eq!((plan.config.grid_dim.0, plan.rows), (66, 66));
    assert_eq!(
        attn.scratch_len(),
        (66 * ATTENTION_FUSED_ROW_LEN).next_multiple_of(4)
            + ATTENTION_FUSED_ROW_LEN.next_multiple_of(4)
            + ATTENTION_FUSED_FOLD_LEN
    );
    let plan = iqn_wgmma_plan(iqn).unwrap();
    assert_eq!((plan.config.grid_dim.0, plan.rows), (116, 116));
    // iqn_fused: sms times the blocks an SM holds (one at H = 256, 16 warps; two at
    // H = 128), and never more than the batch.
    assert_eq!(iqn_fused_plan(iqn).unwrap().rows, 116);
    let half = IqnFusedDims { hidden: 128, ..iqn };
    assert_eq!(iqn_fused_plan(half).unwrap().rows, 232);
    let small = IqnFusedDims { batch: 100, ..iqn };
    assert_eq!(iqn_fused_plan(small).unwrap().rows, 100);
    // The scratch iqn_fused's plan sizes holds iqn_wgmma's rows on the same SMs.
    assert!(iqn_wgmma_plan(iqn).unwrap().scratch_len <= iqn.scratch_len());
    // A tile of eight samples (two for iqn_wgmma) is the least a block takes.
    let few = AttnFusedDims { batch: 40, ..attn };
    assert_eq!(attention_fused_plan(few).unwrap().rows, 5);
    // None: refused with the reason, and no scratch asked for.
    let no_attn = AttnFusedDims { sms: 0, ..attn };
    let no_iqn = IqnFusedDims { sms: 0, ..iqn };
    assert!(!no_attn.fused_takes() && no_attn.scratch_len() == 0);
    assert!(!no_iqn.supported() && no_iqn.scratch_len() == 0);
    for (err, kernel) in [
        (
            attention_fused_plan(no_attn).unwrap_err(),
            "attention_fused",
        ),
        (iqn_fused_plan(no_iqn).unwrap_err(), "iqn_fused"),
        (iqn_wgmma_plan(no_iqn).unwrap_err(), "iqn_fused"),
    ] {
        let err = err.to_string();
        assert!(
            err.contains(&format!("{kernel}: expected sms of at least 1"))
                && err.contains("132 is the whole GPU), found 0"),
            "{err}"
        );
    }
}

#[test]
fn attention_fused_takes_the_step_sizes_only() {
    let step = |batch| AttnFusedDims {
        batch,
        state: 64,
        window: 8,
        width: 64,
        heads: 4,
        sms: PERSISTENT_SMS,
    };
    // Eight samples a tile, one tile at least per block, at most one block per SM.
    for (batch, blocks) in [(1, 1), (8, 1), (9, 2), (300, 38), (2001, 132), (16384, 132)] {
        let dims = step(batch);
        assert!(dims.fused_takes(), "{dims:?}");
        let plan = attention_fused_plan(dims).unwrap();
        assert_eq!(plan.config.grid_dim, (blocks, 1, 1), "{dims:?}");
        assert_eq!(plan.config.block_dim, (256, 1, 1));
        assert_eq!(plan.config.shared_mem_bytes, ATTENTION_FUSED_SHARED_BYTES);
        assert_eq!(plan.rows, blocks);
        // A partial row a block, the row of their sums, and the folded weights, the
        // last two 16-byte aligned.
        let rows_len = (blocks as usize * ATTENTION_FUSED_ROW_LEN).next_multiple_of(4);
        assert_eq!(
            plan.scratch_len,
            rows_len + ATTENTION_FUSED_ROW_LEN.next_multiple_of(4) + ATTENTION_FUSED_FOLD_LEN
        );
        assert_eq!(plan.fold.grid_dim, (48, 1, 1));
        assert_eq!(dims.scratch_len(), plan.scratch_len);
        // A block of 32 columns of the rows each (12418 = 388 x 32 + 2), then 48 blocks
        // of dwqkv's rows, 16 of dwemb's and one for the rest.
        assert_eq!(plan.sums.grid_dim, (389, 1, 1));
        assert_eq!(plan.sums.block_dim, (32, 32, 1));
        assert_eq!(plan.grads.grid_dim, (65, 1, 1));
        assert_eq!(plan.grads.block_dim, (256, 1, 1));
    }
    for dims in [
        AttnFusedDims {
            state: 32,
            ..step(64)
        },
        AttnFusedDims {
            window: 4,
            ..step(64)
        },
        AttnFusedDims {
            width: 128,
            ..step(64)
        },
        AttnFusedDims {
            heads: 8,
            ..step(64)
        },
    ] {
        assert!(!dims.fused_takes(), "{dims:?}");
        assert_eq!(dims.scratch_len(), 0);
        let err = attention_fused_plan(dims).unwrap_err().to_string();
        assert!(
            err.contains("attention_fused: expected S = 64, W = 8, E = 64 and Hh = 4")
                && err.contains(&format!(
                    "found S = {}, W = {}, E = {}, Hh = {}",
                    dims.state, dims.window, dims.width, dims.heads
                )),
            "{err}"
        );
    }
    let err = attention_fused_plan(step(0)).unwrap_err().to_string();
    assert!(err.contains("attention_fused: batch"), "{err}");
    assert!(!step(1 << 30).fused_takes());
}

#[test]
fn iqn_wgmma_takes_the_step_sizes_only_and_fits_the_fallback_scratch() {
    let step = |batch| IqnFusedDims {
        batch,
        quantiles: 32,
        hidden: 256,
        cosines: 64,
        sms: PERSISTENT_SMS,
    };
    // Two samples a tile, one tile at least per block, at most one block per SM.
    for (batch, blocks) in [(1, 1), (2, 1), (3, 2), (263, 132), (264, 132), (16384, 132)] {
        let dims = step(batch);
        assert!(dims.wgmma_takes(), "{dims:?}");
        let plan = iqn_wgmma_plan(dims).unwrap();
        assert_eq!(plan.config.grid_dim, (blocks, 1, 1), "{dims:?}");
        assert_eq!(plan.config.block_dim, (256, 1, 1));
        assert_eq!(plan.config.shared_mem_bytes, IQN_WGMMA_SHARED_BYTES);
        assert_eq!(plan.rows, blocks);
        // The scratch IqnFusedDims asks for (iqn_fused's) holds iqn_wgmma's rows too.
        assert!(plan.scratch_len <= dims.scratch_len(), "{dims:?}");
        assert_eq!(plan.scratch_len, blocks as usize * (2 * 256 + 2 + 256 * 64));
    }
    // Any other N, C or H takes iqn_fused, and iqn_wgmma's plan says why.
    for dims in [
        IqnFusedDims {
            quantiles: 33,
            ..step(64)
        },
        IqnFusedDims {
            quantiles: 16,
            ..step(64)
        },
        IqnFusedDims {
            cosines: 63,
            ..step(64)
        },
        IqnFusedDims {
            hidden: 128,
            ..step(64)
        },
    ] {
        assert!(dims.supported() && !dims.wgmma_takes(), "{dims:?}");
        let err = iqn_wgmma_plan(dims).unwrap_err().to_string();
        assert!(
            err.contains("expected N = 32 quantiles, C = 64 cosine features and H = 256")
                && err.contains(&format!(
                    "found N = {}, C = {}, H = {}",
                    dims.quantiles, dims.cosines, dims.hidden
                )),
            "{err}"
        );
    }
    // Sizes neither kernel takes: the error names the size that is wrong.
    assert!(!step(0).wgmma_takes());
    let err = iqn_wgmma_plan(step(0)).unwrap_err().to_string();
    assert!(err.contains("batch"), "{err}");
    assert!(!step(1 << 27).wgmma_takes(), "B N past 32 bits");
    let err = iqn_wgmma_plan(step(1 << 27)).unwrap_err().to_string();
    assert!(err.contains("tau ([B, N])"), "{err}");
}

#[test]
fn attention_plan_fits_shared_memory() {
    let dims = AttentionDims {
        batch: 16384,
        window: 8,
        width: 64,
        heads: 4,
    };
    assert_eq!(dims.head_width(), 16);
    assert_eq!(dims.scale(), 0.25);
    // The step's sizes take the warp path: 4 warps (samples) a block of 128 threads.
    let fwd = attention_plan(dims, false).unwrap();
    assert_eq!(fwd.path, AttentionPath::WarpPerSample);
    assert_eq!((fwd.spb, fwd.ld, fwd.lda), (4, 196, 68));
    assert_eq!(fwd.config.grid_dim, (4096, 1, 1));
    assert_eq!(fwd.config.block_dim, (128, 1, 1));
    assert_eq!(fwd.config.shared_mem_bytes, 4 * 8 * 196 * 4);
    let bwd = attention_plan(dims, true).unwrap();
    assert_eq!(bwd.path, AttentionPath::WarpPerSample);
    assert_eq!(bwd.spb, 4);
    assert_eq!(bwd.config.block_dim, (128, 1, 1));
    // qkv and datt tiles, and 32 rows of 9 (P, dS) pairs.
    assert_eq!(
        bwd.config.shared_mem_bytes,
        4 * (8 * (196 + 68) + 4 * (32 * 9 / 2)) * 4
    );
    // A batch that no block size divides: the last block has idle warps.
    let ragged = attention_plan(
        AttentionDims {
            batch: 1001,
            ..dims
        },
        true,
    )
    .unwrap();
    assert_eq!(ragged.config.grid_dim, (251, 1, 1));
    // Wider heads, or a longer window, take the block path at the old sizes.
    for other in [
        AttentionDims { heads: 2, ..dims },
        AttentionDims { window: 9, ..dims },
    ] {
        let plan = attention_plan(other, false).unwrap();
        assert_eq!(plan.path, AttentionPath::BlockOfSamples, "{other:?}");
        assert_eq!(plan.config.block_dim, (BLOCK_THREADS, 1, 1));
    }
    let block = attention_plan(AttentionDims { heads: 2, ..dims }, true).unwrap();
    assert_eq!((block.spb, block.ld, block.lda), (4, 196, 68));
    assert_eq!(block.config.grid_dim, (4096, 1, 1));
    assert_eq!(
        block.config.shared_mem_bytes,
        4 * (8 * (196 + 68) + 2 * 2 * 64) * 4
    );
    // Many heads: fewer warps a block, as shared memory allows.
    let wide = AttentionDims {
        batch: 10,
        window: 8,
        width: 128,
        heads: 8,
    };
    let plan = attention_plan(wide, true).unwrap();
    assert_eq!((plan.path, plan.spb), (AttentionPath::WarpPerSample, 2));
    assert_eq!(plan.config.grid_dim, (5, 1, 1));
    assert_eq!(plan.config.block_dim, (64, 1, 1));
    // A tile too wide for one warp: the block path, which cannot fit a sample either.
    let too_wide = AttentionDims {
        batch: 10,
        window: 8,
        width: 1024,
        heads: 64,
    };
    assert!(attention_plan(too_wide, true).is_err());
    for plan in [fwd, bwd, ragged, block, plan] {
        assert!(plan.config.shared_mem_bytes as usize <= MAX_DYNAMIC_SMEM);
    }
    // Widths that are not multiples of 4 get one-float padding.
    let odd = AttentionDims {
        batch: 5,
        window: 3,
        width: 6,
        heads: 2,
    };
    let plan = attention_plan(odd, true).unwrap();
    assert_eq!(plan.path, AttentionPath::BlockOfSamples);
    assert_eq!((plan.ld, plan.lda, plan.spb), (19, 7, 4));
    assert_eq!(plan.config.grid_dim, (2, 1, 1));
    // A window too large for one sample per block, and heads that do not divide E.
    assert!(attention_plan(AttentionDims { window: 64, ..dims }, true).is_err());
    assert!(attention_plan(AttentionDims { heads: 3, ..dims }, false).is_err());
}

#[test]
fn attention_constants_match_the_cuda_source() {
    let attention = cuda_defines("attention.cu");
    assert_eq!(attention["ATT_DH"], ATTENTION_WARP_HEAD_WIDTH.to_string());
    assert_eq!(attention["ATT_WMAX"], ATTENTION_WARP_MAX_WINDOW.to_string());
    assert_eq!(
        attention["ATT_MAX_WARPS"],
        ATTENTION_WARP_MAX_WARPS.to_string()
    );
    assert_eq!(attention["ATTN_POOL_BLOCKS"], ATTN_POOL_BLOCKS.to_string());
}

#[test]
fn trunk_grad_join_takes_chunks_of_128_rows() {
    // The split itself is `row_chunk_plan`'s, tested in stepgraph-kernels. The step's
    // sizes: 128 chunks of 128 rows, 1024 blocks.
    assert_eq!(trunk_grad_join_plan(16384, 256), (8, 128, 128));
    assert_eq!(
        trunk_grad_join_plan(16384, 256),
        row_chunk_plan(16384, 256, 128)
    );
}

#[test]
fn quad_grids_cover_every_element() {
    // iqn_cos_features' contract: `grid = elementwise(cdiv(rows * C, 4))`.
    for n in [0u32, 1, 4, 1024, 1025, 16384 * 256] {
        let cfg = raw::contract::elementwise(n.div_ceil(4));
        let threads = cfg.grid_dim.0 as usize * BLOCK_THREADS as usize;
        assert!(threads * 4 >= n as usize && cfg.grid_dim.0 >= 1, "n = {n}");
        assert!((cfg.grid_dim.0 as usize - 1) * BLOCK_THREADS as usize * 4 < n.max(1) as usize);
    }
}

/// The grids the contracts of `cuda/*.cu` declare are the ones the hand-written
/// launches used: `elementwise` is `elementwise_config`, `tiles` is `tile_config`.
#[test]
fn contract_grids_are_the_launch_helpers_grids() {
    let same = |a: LaunchConfig, b: LaunchConfig| {
        (a.grid_dim, a.block_dim, a.shared_mem_bytes)
            == (b.grid_dim, b.block_dim, b.shared_mem_bytes)
    };
    assert_eq!(raw::contract::BLOCK_THREADS, BLOCK_THREADS);
    for n in [0u32, 1, 255, 256, 257, 4096, 1 << 20, u32::MAX] {
        assert!(
            same(raw::contract::elementwise(n), elementwise_config(n)),
            "elementwise({n})"
        );
        for y in [0u32, 1, 7] {
            assert!(
                same(raw::contract::tiles(n, y), tile_config(n, y)),
                "tiles({n}, {y})"
            );
        }
    }
    let rows = raw::contract::launch("k", [3, 0, 1], [256, 1, 1]).unwrap();
    assert_eq!((rows.grid_dim, rows.block_dim), ((3, 1, 1), (256, 1, 1)));
    assert!(raw::contract::launch("k", [3, 1, 1], [256, 0, 1]).is_err());
    assert_eq!(raw::contract::blocks(0, 32).grid_dim, (1, 1, 1));
}

/// A safe launcher refuses before it launches: its checks need no GPU, so they run on
/// the generated `contract` helpers it calls.
#[test]
fn contract_checks_name_the_kernel_and_the_buffer() {
    use raw::contract;
    let err = contract::len(
        "glu_forward",
        "u",
        "2 * n",
        5,
        contract::mul(Some(2), Some(3)),
    )
    .unwrap_err();
    assert!(
        matches!(&err, Error::LengthMismatch { what, expected: 6, found: 5 } if what == "glu_forward: u ([2 * n])"),
        "{err:?}"
    );
    assert!(contract::len("k", "x", "n", 6, Some(6)).is_ok());
    let too_long = u32::MAX as usize + 1;
    assert!(matches!(
        contract::len("k", "x", "n", too_long, Some(too_long)),
        Err(Error::TooLarge { .. })
    ));
    let err = contract::len(
        "glu_forward",
        "u",
        "2 * n",
        5,
        contract::mul(Some(2), Some(usize::MAX)),
    )
    .unwrap_err();
    assert!(
        err.to_string().contains(
            "glu_forward: u: expected the size `2 * n` in range, found one that overflows"
        ),
        "{err}"
    );
    assert!(matches!(
        contract::positive("glu_forward", "G", 0),
        Err(e @ Error::Argument { .. }) if e.to_string() == "glu_forward: G: expected at least 1, found 0"
    ));
    assert!(contract::at_least("k", "scratch", "n", 7, Some(6)).is_ok());
    assert!(matches!(
        contract::at_least("k", "scratch", "n", 5, Some(6)),
        Err(Error::LengthMismatch {
            expected: 6,
            found: 5,
            ..
        })
    ));
    assert!(contract::scalar::<u32>("k", "n", "unsigned", too_long).is_err());
    assert_eq!(contract::scalar::<u32>("k", "n", "unsigned", 7).unwrap(), 7);
    assert_eq!(contract::cdiv(Some(9), Some(4)), Some(3));
    assert_eq!(contract::cdiv(Some(9), Some(0)), None);
    assert_eq!(contract::sub(Some(1), Some(2)), None);
    assert_eq!(contract::rem(Some(9), Some(4)), Some(1));
    assert_eq!(contract::rem(Some(9), Some(0)), None);
    let w = contract::rem(Some(68), Some(4));
    assert!(contract::holds("k", "S % 4 == 0", w, "==", Some(0)).is_ok());
    let err = contract::holds(
        "trunk_l1_grad_partial",
        "H <= TL1_MAX_H",
        Some(320),
        "<=",
        Some(256),
    )
    .unwrap_err()
    .to_string();
    assert_eq!(
        err,
        "trunk_l1_grad_partial: expected `H <= TL1_MAX_H`, found 320 on the left and 256 on \
         the right"
    );
    assert!(contract::holds("k", "n >= m", Some(2), ">=", Some(3)).is_err());
}

#[test]
fn attn_pool_scratch_is_one_row_per_block() {
    let dims = AttnPoolDims {
        batch: 16384,
        window: 8,
        width: 64,
    };
    assert_eq!(dims.scratch_len(), ATTN_POOL_BLOCKS as usize * 66);
    assert_eq!(AttnPoolDims { batch: 3, ..dims }.scratch_len(), 3 * 66);
}

#[test]
fn dqn_size_checks_name_the_operand() {
    let err = product("iqn: phi", &[usize::MAX, 2]).unwrap_err();
    assert!(err.to_string().contains("iqn: phi"), "{err}");
    assert!(positive("glu_forward: width", 0).is_err());
    assert_eq!(positive("w", 7).unwrap(), 7);
    let err = check_len("ddqn_target: y ([B, D])", 3, 4).unwrap_err();
    assert!(matches!(
        err,
        Error::LengthMismatch {
            expected: 4,
            found: 3,
            ..
        }
    ));
}
