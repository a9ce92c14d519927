"""Why the cost model puts Meta's no-recomputation Llama 3 405B runs out of memory, term by term.

Grattafiori et al. 2024 (section 3.3.2) state for the 8K pre-training of Llama 3 405B: TP 8,
PP 16, an interleaved schedule (V not given), no activation checkpointing, FSDP that shards the
optimizer states and gradients but keeps the gathered weights, gradients accumulated in FP32
across micro-batches and reduce-scattered in FP32. config/validation/published_runs.yaml prices
exactly that (ZeRO-1 with an FP32 gradient buffer: the FP32 accumulation across micro-batches
needs the unsharded buffer until the reduce-scatter). These tests compute, another way, each
term of the peak the model reports for the binding device and show which one is out of reach:
the activation stash, Megatron-LM's saved-tensor set times Megatron-Core's interleaved warm-up
(the smallest its schedule allows, tests/test_interleaved_megatron.py), is 75 GB at 8,192 GPUs
and 68 GB at 16,384 (one whole model's worth of one micro-batch). The term that was wrong: the
FP32 gradient buffer, which Meta's FSDP creates layer by layer at the first backward
(grad_buffer: lazy; nest.costs.memory.lazy_gradient_peak), not before the activation peak: the
16,384-GPU run fits. At 8,192 GPUs only the saved set per block was left, which the paper does
not state: both rows are a band over it (Megatron-LM / Transformer Engine's set or metaseq's,
which re-runs the norms and the MLP activation in backward; round seven, the last tests), and
metaseq's fits. docs/modeling.md, "Llama 3 405B memory"; the model is not tuned to the rows.
"""

import pytest

from nest.costs.pipeline import interleaved_order

P, V, M = 16, 8, 32  # pipeline stages, chunks per device, micro-batches per pipeline (2048 / 64)
S, H, F, HEADS, KV, T = 8192, 16384, 53248, 128, 8, 8  # Llama 3 405B, seq 8192, TP 8


def _evaluated(run_id: str):
    from nest.problem.evaluate import evaluate
    from nest.problem.plan_spec import expand
    from nest.fidelity.published_runs import band_members, load_runs, plan_spec, problem_for

    row = next(r for r in load_runs() if r["id"] == run_id)
    mem = next(m for m in band_members(row) if m["virtual_stages"] == V)
    pr = problem_for(mem)
    ev = evaluate(expand(plan_spec(mem, pr.graph.num_layers), pr, "test"), pr)
    layer = pr.graph.layers[3].costs["tp8_sp1_ep1_cp1"]
    return ev, pr, layer


@pytest.fixture(scope="module")
def rank1():
    return _evaluated("llama3_405b_8192gpu")


def test_layer_activations_are_korthikanti_count(rank1):
    """Bytes one Llama block saves for backward (BF16, sequence parallel, flash attention), in
    Korthikanti et al. 2022's accounting: norm inputs, QKV input, attention output, out-proj
    input, MLP input (each 2 s b h / t), Q and the GQA K, V (2 s b (h + 2 h_kv) / t), gate, up
    and their SwiGLU product (6 s b f / t), plus flash attention's fp32 log-sum-exp."""
    _, _, layer = rank1
    hkv = KV * H // HEADS
    count = (12 * S * H + 4 * S * hkv + 6 * S * F) / T + 4 * S * HEADS / T
    assert layer.act_bytes["none"] == pytest.approx(count, rel=2e-3)
    assert layer.act_bytes["none"] / 1e9 == pytest.approx(0.533, abs=1e-3)


def test_rank1_holds_141_one_layer_chunks():
    """Megatron-LM's interleaved warm-up on pipeline rank 1: 2 (p - 2) + (V - 1) p forwards,
    then one more before the first backward: 141 chunk activations; at V = 8 every chunk of rank
    1 is one block (126 blocks, the first and last chunk only the embedding / head)."""
    held = peak = 0
    for kind, _, _ in interleaved_order(P, M, V, 1):
        held += 1 if kind == "F" else -1
        peak = max(peak, held)
    assert peak == 2 * (P - 2) + (V - 1) * P + 1 == 141


def test_peak_term_by_term(rank1):
    """The model's peak for rank 1 is the sum of these terms, each computed here another way;
    activations alone (141 x 0.533 GB = 75.2 GB) leave 9.8 GB of the 85.0 GB for everything
    else, against 19.7 GB of weights and states as Meta describes them; even with the FP32
    gradients sharded (0.2 GB instead of 12.75) the sum is 82.4 GB before the allocator's
    fragmentation and the framework reserve, i.e. 88.0 GB with the hardware file's estimates."""
    ev, pr, layer = rank1
    st = ev.stages[1]
    mb = st.memory_bytes
    hw = pr.cluster.hardware
    params = 8 * layer.dense_params  # 8 one-block chunks
    assert mb["activations"] == pytest.approx(141 * layer.act_bytes["none"], rel=1e-6)
    assert mb["weights"] == pytest.approx(2 * params, rel=1e-6)       # BF16, not resharded
    assert mb["gradients"] == pytest.approx(4 * params, rel=1e-6)     # FP32 accumulation
    assert mb["optimizer_states"] == pytest.approx(12 * params / 64, rel=1e-6)  # dp 64
    assert st.peak_memory_bytes / 1e9 == pytest.approx(101.15, abs=0.05)
    assert mb["activations"] > hw.hbm_bytes - (mb["weights"] + mb["gradients"])
    sharded = mb["weights"] + 4 * params / 64 + mb["optimizer_states"] + mb["activations"]
    assert sharded / 1e9 == pytest.approx(82.4, abs=0.1)
    assert (sharded * (1 + hw.memory_fragmentation) + hw.memory_overhead_bytes
            > hw.hbm_bytes)


def test_16384_gpus_binds_on_rank1_with_every_forward_in_warmup():
    """16,384 GPUs: m = p = 16. Megatron-Core's warm-up on device 1 is 2 (p - 2) + (V - 1) p =
    140 >= m V = 128, so every forward runs first: 128 one-block chunks; the last device starts
    1F1B after 112 + 1 (it used to hold all 16 of its LM-head micro-batches too, 97.6 GB). The
    peak is device 1's at its first backward: 128 x 533 MB, 6.38 GB BF16 weights, the optimizer
    shard over dp 128, and the FP32 gradient of the one chunk that backward created (Meta's
    FSDP creates a layer's FP32 main gradient at its first backward: grad_buffer lazy), with the
    hardware file's fragmentation and reserve: 81.8 GB, under the 85.0 GB. With the gradient
    buffer held all step (Megatron-LM's) it would be 93.6 GB."""
    ev, pr, layer = _evaluated("llama3_405b_16384gpu")
    hw = pr.cluster.hardware
    params = 8 * layer.dense_params
    st = ev.stages[1]
    mb = st.memory_bytes
    assert mb["activations"] == pytest.approx(128 * layer.act_bytes["none"], rel=1e-6)
    assert mb["gradients"] == pytest.approx(4 * layer.dense_params, rel=1e-6)  # one chunk
    alloc = 2 * params + 4 * params / 8 + 12 * params / 128 + 128 * layer.act_bytes["none"]
    assert st.peak_memory_bytes == pytest.approx(
        alloc * (1 + hw.memory_fragmentation) + hw.memory_overhead_bytes, rel=1e-6)
    assert st.peak_memory_bytes / 1e9 == pytest.approx(81.8, abs=0.05)
    assert max(s.peak_memory_bytes for s in ev.stages) == st.peak_memory_bytes
    assert ev.feasible
    persistent = alloc + 4 * params * 7 / 8
    assert (persistent * (1 + hw.memory_fragmentation) + hw.memory_overhead_bytes) / 1e9 \
        == pytest.approx(93.56, abs=0.05)


def _walk(ops, act, grad, lazy: bool):
    """Brute force: the held bytes after every step, gradients created at a chunk's first
    backward (lazy) or all at the start."""
    held, made, best = 0.0, set(), 0.0
    base = 0.0 if lazy else sum(grad)
    for kind, c, _ in ops:
        if kind == "F":
            held += act[c]
        elif lazy and c not in made:
            made.add(c)
            base += grad[c]
        best = max(best, held + base)
        if kind == "B":
            held -= act[c]
    return best


def test_lazy_gradient_peak_closed_form():
    """m = p, V chunks of activation a and gradient g on device 0: every forward is a warm-up
    one (2 (p - 1) + (V - 1) p >= p V), so the peak is at the first backward: p V a held and one
    chunk's gradient, p V a + g, where a persistent buffer gives p V a + V g."""
    from nest.costs.memory import lazy_gradient_peak

    p, v, a, g = 4, 3, 1.0, 2.5
    act, grad = lazy_gradient_peak(interleaved_order(p, p, v, 0), [a] * v, [g] * v)
    assert (act, grad) == (p * v * a, g)
    assert _walk(interleaved_order(p, p, v, 0), [a] * v, [g] * v, lazy=False) == p * v * a + v * g


@pytest.mark.parametrize("p,m,v,d", [(4, 8, 2, 0), (4, 8, 2, 3), (3, 9, 3, 1), (8, 16, 4, 2),
                                     (2, 2, 5, 0)])
def test_lazy_gradient_peak_matches_brute_force(p, m, v, d):
    """Unequal chunks (the embedding- or head-only ones of Meta's layout): the function's peak
    equals a step-by-step walk and never exceeds the persistent buffer's."""
    from nest.costs.memory import lazy_gradient_peak

    act = [0.2 + 0.3 * c for c in range(v)]
    grad = [1.0 + 0.5 * ((c * 7) % 3) for c in range(v)]
    a, g = lazy_gradient_peak(interleaved_order(p, m, v, d), act, grad)
    assert a + g == pytest.approx(_walk(interleaved_order(p, m, v, d), act, grad, lazy=True))
    assert a + g <= _walk(interleaved_order(p, m, v, d), act, grad, lazy=False) + 1e-12


def test_bad_grad_buffer_names_file_key_and_value():
    """A published row's grad_buffer outside nest.costs.memory.GRAD_BUFFERS: a SpecError naming
    the table, the run, the key and the value; config/training.yaml's schema takes the same two."""
    import jsonschema

    from nest.common.errors import SpecError
    from nest.fidelity.published_runs import load_runs, training_for
    from nest.spec.catalog import load_schema

    row = dict(next(r for r in load_runs() if r["id"] == "llama3_405b_16384gpu"),
               grad_buffer="sometimes")
    with pytest.raises(SpecError, match=r"published_runs.yaml: run 'llama3_405b_16384gpu': "
                                        r"key 'grad_buffer': 'sometimes'"):
        training_for(row)
    prop = load_schema("training")["properties"]["grad_buffer"]
    assert sorted(prop["enum"]) == ["lazy", "persistent"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate("sometimes", prop)


@pytest.mark.parametrize("v", [2, 4, 8])
def test_meta_layout_at_every_v(v):
    """`cuts: ends_alone` is Meta's stated layout at every V: the embedding alone in the first
    chunk, the head alone in the last, 7 blocks on the first and the last pipeline rank and 8
    on the others ("we reduce one Transformer layer each from the first and the last stages");
    at V = 8 it is `even_layers` (one layer-graph layer a chunk)."""
    from nest.fidelity.published_runs import ends_alone_sizes, load_runs, plan_spec

    sizes = ends_alone_sizes(P, v, 128)  # embedding + 126 blocks + head
    assert len(sizes) == P * v and sizes[0] == sizes[-1] == 1
    per_rank = [sum(sizes[d::P]) for d in range(P)]
    assert per_rank == [8] * P  # rank 0: embedding + 7 blocks, rank 15: 7 blocks + head
    assert sorted(sizes[P::P]) == sorted(sizes[P - 1:-1:P])  # ranks 0 and 15 split 7 alike
    row = dict(next(r for r in load_runs() if r["id"] == "llama3_405b_8192gpu"),
               virtual_stages=v)
    cuts = plan_spec(row, 128)["cuts"]
    assert [b - a + 1 for a, b in cuts] == sizes and cuts[-1][1] == 127
    if v == 8:
        assert cuts == plan_spec(dict(row, cuts="even_layers"), 128)["cuts"]


def test_ends_alone_refuses_counts_that_do_not_divide():
    from nest.common.errors import SpecError
    from nest.fidelity.published_runs import load_runs, plan_spec

    row = dict(next(r for r in load_runs() if r["id"] == "llama3_405b_8192gpu"),
               virtual_stages=3)
    with pytest.raises(SpecError, match=r"published_runs.yaml: run 'llama3_405b_8192gpu': "
                                        r"key 'cuts': ends_alone needs virtual_stages"):
        plan_spec(row, 128)


def test_8192_gpus_out_of_memory_even_with_asynchronous_warmup(rank1):
    """Meta states asynchronous point-to-point sends (section 3.3.2). With those, the fewest
    warm-up forwards that keep the bubble are (p - d - 1) + (V - 1) p, not Megatron-Core's
    2 (p - d - 1) + (V - 1) p (tests/test_interleaved_inflight.py): device 1 would hold 127
    one-block chunks, not 141. Its peak is still 93.3 GB > 85.0 GB: every chunk's FP32 gradient
    buffer exists by then (the backwards of all 8 chunks run in the steady phase). Fitting would
    take at most 0.471 GB a block (28.07 s b h / t bytes against the 31.75 counted), or the FP32
    gradient not held unsharded through the steady phase."""
    from nest.costs.memory import allocatable, peak

    ev, pr, layer = rank1
    hw = pr.cluster.hardware
    mb = ev.stages[1].memory_bytes
    a = layer.act_bytes["none"]
    held = (P - 2) + (V - 1) * P + 1
    assert held == 127
    rest = mb["weights"] + mb["gradients"] + mb["optimizer_states"] + mb["working"]
    assert mb["gradients"] == pytest.approx(4 * 8 * layer.dense_params, rel=1e-6)  # all 8
    assert peak(rest + held * a, hw) / 1e9 == pytest.approx(93.32, abs=0.01)
    assert peak(rest + held * a, hw) > hw.hbm_bytes
    per_block = (allocatable(hw) - rest) / held
    assert per_block / 1e9 == pytest.approx(0.471, abs=1e-3)
    assert per_block / (S * H / T) == pytest.approx(28.07, abs=0.01)
    sharded = rest - mb["gradients"] + mb["gradients"] / 64  # ZeRO-2-like: FP32 shard only
    assert peak(sharded + held * a, hw) < hw.hbm_bytes


# ---- Round six (issue 26): the brief's candidates, each checked against a second source ----

def _pytorch_order(p: int, m: int, v: int, d: int):
    """Device d's operations in PyTorch's own interleaved 1F1B (torch.distributed.pipelining.
    schedules.ScheduleInterleaved1F1B, torch 2.13: the flexible schedule of rounds of N =
    m // max(1, m // p) micro-batches, whose docstring example, 4 ranks and 10 micro-batches, is
    Grattafiori et al. 2024's Figure 6), called on its own code without a process group, as
    ('F' | 'B', chunk, micro-batch); the idle slots it pads with are dropped."""
    from types import SimpleNamespace

    sched = pytest.importorskip("torch.distributed.pipelining.schedules")
    rounds = max(1, m // p)
    me = SimpleNamespace(n_local_stages=v, microbatches_per_round=m // rounds, pp_group_size=p,
                         _n_microbatches=m)
    ops = sched.ScheduleInterleaved1F1B._calculate_single_rank_operations(me, d)
    fwd = sched._ComputationType.FORWARD
    return [("F" if a.computation_type == fwd else "B", a.stage_index // p, a.microbatch_index)
            for a in ops if a is not None]


def _in_flight(ops) -> int:
    held = most = 0
    for kind, _, _ in ops:
        held += 1 if kind == "F" else -1
        most = max(most, held)
    return most


@pytest.mark.parametrize("m,v", [(32, 8), (32, 4), (32, 2), (16, 8), (16, 4), (16, 2)])
def test_pytorch_interleaved_1f1b_orders_as_priced(m, v):
    """The in-flight count has a second source. PyTorch's interleaved 1F1B posts its sends
    asynchronously (its runtime waits on them at the end of the step) and still warms up
    (V - 1) N + 2 (p - 1 - d) forwards, as Megatron-Core does; on both 405B pipelines (p 16, m 32 and 16) its order on every device
    is the one the model walks (nest.costs.pipeline.interleaved_order), so the model holds no
    chunk more than the public implementation of Meta's flexible schedule: 141 on device 1 at
    8,192 GPUs and V = 8. Asynchronous sends alone do not give the least count
    (test_8192_gpus_out_of_memory_even_with_asynchronous_warmup)."""
    for d in range(P):
        assert _pytorch_order(P, m, v, d) == list(interleaved_order(P, m, v, d))
    if (m, v) == (32, 8):
        assert _in_flight(_pytorch_order(P, m, v, 1)) == 141


def test_pytorch_figure6_group_above_p_adds_v_minus_one():
    """Figure 6's own case (4 ranks, V = 2, 10 micro-batches): PyTorch takes N = 10 // 2 = 5 > p,
    and device d holds (V - 1) N + 2 (p - 1 - d) + 1 chunks, one more than with N = p = 4: a
    group of N above p costs V - 1 chunks a step, which is why the rows are priced at N = p."""
    p, m, v = 4, 10, 2
    for d in range(p):
        assert _in_flight(_pytorch_order(p, m, v, d)) == (v - 1) * 5 + 2 * (p - 1 - d) + 1


def test_8192_gpus_no_gradient_state_or_overhead_term_fits(rank1):
    """With the priced (Megatron-Core's = PyTorch's) count, device 1's 141 one-block chunks and
    its BF16 weights and optimizer shard alone exceed the HBM less the allocator's 5% and the
    1.5 GB reserve, with no gradient at all; and with the FP32 gradient as priced they exceed
    the bare HBM with no fragmentation and no reserve. The largest saved set a block could keep
    (beside flash attention's log-sum-exp): 25.25 s b h / t bytes with the FP32 gradient (30.64
    with none), against 31.75 for Megatron-LM / Transformer Engine's set. Sets of public code, each in s b h / t (BF16):
    norms that save only their output (apex `memory_efficient`, Megatron-LM
    --memory-efficient-layer-norm): 27.75, still out of memory; the SwiGLU product alone
    recomputed: 25.25, at the bound (85.0 GB, no margin); norm outputs and the SwiGLU product
    recomputed in backward (what metaseq's SequeuceParallelTransformerBlock does for its norms
    and GeLU, "always recomputed"): 21.25, 75.1 GB. No source says which the 405B run kept."""
    from nest.costs.memory import allocatable, peak

    ev, pr, layer = rank1
    hw = pr.cluster.hardware
    mb = ev.stages[1].memory_bytes
    sbh_t = S * H / T
    lse = 4 * S * HEADS / T  # flash attention's fp32 log-sum-exp, in every set
    hkv = KV * H // HEADS
    megatron = (12 * S * H + 4 * S * hkv + 6 * S * F) / T  # Korthikanti's terms (test above)
    assert megatron / sbh_t == pytest.approx(31.75)
    weights_states = mb["weights"] + mb["optimizer_states"]
    assert weights_states + mb["activations"] > allocatable(hw)              # no gradient
    assert weights_states + mb["gradients"] + mb["activations"] > hw.hbm_bytes  # no overheads
    bound = (allocatable(hw) - weights_states - mb["gradients"]) / 141 - lse
    assert bound / sbh_t == pytest.approx(25.25, abs=0.01)
    assert ((allocatable(hw) - weights_states) / 141 - lse) / sbh_t == pytest.approx(30.64,
                                                                                    abs=0.01)
    mem_eff_norms = megatron - 2 * 2 * S * H / T        # the two norm inputs not kept
    recomputed = megatron - 2 * 2 * S * H / T - 2 * S * F / T  # norm outputs, SwiGLU product
    assert (mem_eff_norms / sbh_t, recomputed / sbh_t) == (27.75, 21.25)
    assert mem_eff_norms > bound > recomputed
    fits = peak(weights_states + mb["gradients"] + 141 * (recomputed + lse), hw)
    assert fits / 1e9 == pytest.approx(75.1, abs=0.05)


def test_8192_gpus_sharded_gradient_flavour_exceeds_the_measured_step(rank1):
    """The paper's FSDP sentence ("shards the optimizer states and gradients, but ... we do not
    reshard after forward") is PyTorch FSDP's SHARD_GRAD_OP; accumulating over micro-batches it
    has two flavours (PyTorch PR #126166): reduce-scatter every micro-batch and keep shards, or
    keep the unsharded gradient to the last one (priced). The first moves, per device and step,
    the FP32 gradient (paper: "reduce-scatter gradients in FP32") once per micro-batch and, as
    FSDP frees the gathered parameters after every backward outside no_sync (PyTorch's
    SHARD_GRAD_OP docstring; fairscale's FullyShardedDataParallel._post_backward_hook frees
    them "as a special case" only inside no_sync), gathers the BF16 weights again for each
    micro-batch's forward: 32 x (12.75 + 6.38) GB x 63 / 64 over the 48 GB/s each GPU's
    400 Gb/s NIC gives, 12.6 s, longer than the whole measured step (12.02 s) before any
    compute or pipeline send. So that flavour did not run; the memory it would save is moot."""
    from nest.fidelity.published_runs import load_runs, measured_step_s

    ev, pr, layer = rank1
    params = 8 * layer.dense_params
    nic = pr.cluster.levels[-1].bytes_per_s
    assert nic == pytest.approx(48e9)
    dp = 64
    moved = M * (4 * params + 2 * params) * (dp - 1) / dp
    measured, _ = measured_step_s(next(r for r in load_runs()
                                       if r["id"] == "llama3_405b_8192gpu"))
    assert moved / nic == pytest.approx(12.6, abs=0.05)
    assert moved / nic > measured


# ---- Round seven (issue 26): the saved set per block as a band (recompute_modules) ----

SETS = {(): 31.75, ("layernorm",): 27.75, ("act",): 25.25, ("layernorm", "act"): 21.25}


def _member(run_id: str, v: int, mods: tuple):
    from nest.fidelity.published_runs import band_members, load_runs

    row = next(r for r in load_runs() if r["id"] == run_id)
    return next(m for m in band_members(row)
                if m["virtual_stages"] == v and tuple(m["recompute_modules"]) == mods)


@pytest.mark.parametrize("mods", list(SETS))
def test_saved_set_per_block_closed_form(mods):
    """The bytes a Llama 3 405B block keeps for backward in the table the evaluator and the
    solver read (nest.costs.layers), by hand: Megatron-LM / Transformer Engine's set is
    (12 s h + 4 s h_kv + 6 s f) / t bytes (31.75 s b h / t); recomputing the two norms frees
    their outputs, the sequence-parallel shards the qkv and MLP GEMMs keep (2 x 2 s h / t:
    27.75); recomputing the SwiGLU frees its product, the down projection's input (2 s f / t:
    25.25); both (metaseq's SequeuceParallelTransformerBlock): 21.25. Flash attention's fp32
    log-sum-exp stays; full recomputation keeps only the layer input in every set."""
    from nest.costs.layers import ALL_MODES, layer_table
    from nest.fidelity.published_runs import problem_for
    from nest.graph.layer_graph import Variant

    v = Variant.from_key("tp8_sp1_ep1_cp1")
    pr = problem_for(dict(_member("llama3_405b_8192gpu", 8, ()), recompute_modules=list(mods)))
    lt = layer_table(pr, v, ALL_MODES)
    act = dict(zip(ALL_MODES, lt.act_LR[3]))
    lse = 4 * S * HEADS / T
    hkv = KV * H // HEADS
    kept = (12 * S * H + 4 * S * hkv + 6 * S * F) / T
    kept -= (2 * 2 * S * H / T if "layernorm" in mods else 0) + (2 * S * F / T if "act" in mods
                                                                   else 0)
    assert kept / (S * H / T) == SETS[mods]
    assert act["none"] == pytest.approx(kept + lse, rel=2e-3)  # the trace's count, as above
    assert act["selective"] == act["none"]  # flash attention: no score tensors to drop
    assert act["full"] == 2 * S * H / T  # the layer input, whatever the modules
    assert lt.work_LR[3][ALL_MODES.index("full")] == act["none"] - act["full"]
    base = problem_for(_member("llama3_405b_8192gpu", 8, ()))
    base_none = layer_table(base, v, ALL_MODES).act_LR[3][0]
    assert base_none - act["none"] == (31.75 - SETS[mods]) * S * H / T  # exactly what is freed


def test_act_recompute_adds_the_activation_forward_to_backward():
    """Recomputing the activation re-runs its forward before the down projection's backward: the
    block's backward grows by the SwiGLU op's forward time, and with the norms by theirs too
    (host floor off, roofline); the forward is unchanged."""
    from dataclasses import replace

    from nest.costs.profiled import price_op
    from nest.costs.table import layer_times
    from nest.fidelity.published_runs import problem_for

    pr = problem_for(_member("llama3_405b_8192gpu", 8, ()))
    layer = pr.graph.layers[3].costs["tp8_sp1_ep1_cp1"]
    hw = replace(pr.cluster.hardware, host_fwd_s_per_op=0.0, host_bwd_s_per_op=0.0)
    ops = {op.name: op for op in layer.ops}
    fwd = {n: price_op(hw, ops[n], None).fwd_s for n in ("swiglu", "norm1", "norm2")}
    base = layer_times(hw, layer, None)
    act = layer_times(hw, layer, None, recompute_modules=("act",))
    both = layer_times(hw, layer, None, recompute_modules=("layernorm", "act"))
    assert act.fwd_s == both.fwd_s == base.fwd_s
    assert act.bwd_s - base.bwd_s == pytest.approx(fwd["swiglu"], rel=1e-12)
    assert both.bwd_s - base.bwd_s == pytest.approx(sum(fwd.values()), rel=1e-12)
    # the SwiGLU reads gate and up and writes their product: 3 x 2 s f / t bytes, memory-bound
    assert ops["swiglu"].fwd_bytes == pytest.approx(3 * 2 * S * F / T, rel=1e-3)


def test_freed_bytes_only_where_kept():
    """Nothing is freed under FP8 (Transformer Engine keeps its own FP8 copy of the GEMM
    inputs, nest.graph.fp8) or for a layer without the op (the LM head; an MoE block has no
    dense activation); without sequence parallelism a norm's output is the whole s h."""
    from nest.costs.table import module_freed_bytes
    from nest.fidelity.published_runs import problem_for
    from nest.graph.layer_graph import Variant

    pr = problem_for(_member("llama3_405b_8192gpu", 8, ()))
    v = Variant.from_key("tp8_sp1_ep1_cp1")
    layer = pr.graph.layers[3].costs[v.key]
    both = ("layernorm", "act")
    assert module_freed_bytes(both, layer, v, fp8=False) == (4 * S * H + 2 * S * F) / T
    assert module_freed_bytes(both, layer, v, fp8=True) == 0.0
    assert module_freed_bytes(both, pr.graph.layers[-1].costs[v.key], v, fp8=False) == 0.0
    no_sp = Variant(tp=8, sp=False)
    assert module_freed_bytes(("layernorm",), layer, no_sp, fp8=False) == 4 * S * H


def test_8192_gpus_band_over_the_saved_set():
    """The 8,192-GPU row is a band over V and the saved set (the paper states neither). With
    Megatron-LM's set no V fits (101.2 GB at V = 8); with metaseq's, V = 8 and V = 4 fit (75.1
    and 79.9 GB) and V = 2 does not (89.7). Out-of-memory members are left out of the band, as
    for any band: its ends are the fitting members' steps, its peak theirs, and the row counts
    as priced. The V = 8 peak equals the hand sum of the term-by-term test with 21.25 s b h / t
    a block; recomputation makes each fitting member slower than the same V without it."""
    from nest.costs.memory import peak
    from nest.fidelity.published_runs import evaluate_row, load_runs

    row = next(r for r in load_runs() if r["id"] == "llama3_405b_8192gpu")
    res = evaluate_row(row)
    got = {(m.values["virtual_stages"], tuple(m.values["recompute_modules"])): m
           for m in res.members}
    assert len(got) == 6
    meta = ("layernorm", "act")
    fits = {k for k, m in got.items() if m.feasible}
    assert fits == {(4, meta), (8, meta)}
    assert [round(got[v, meta].peak_memory_GB, 1) for v in (2, 4, 8)] == [89.7, 79.9, 75.1]
    assert round(got[8, ()].peak_memory_GB, 1) == 101.2
    assert res.feasible
    assert res.predicted_lo_s == got[8, meta].predicted_s
    assert res.predicted_hi_s == got[4, meta].predicted_s
    assert res.peak_memory_GB == got[8, meta].peak_memory_GB
    for v in (4, 8):
        assert got[v, meta].predicted_s > got[v, ()].predicted_s
    ev, pr, layer = _evaluated("llama3_405b_8192gpu")
    mb = ev.stages[1].memory_bytes
    kept = 21.25 * S * H / T + 4 * S * HEADS / T
    hand = peak(mb["weights"] + mb["optimizer_states"] + mb["gradients"] + 141 * kept,
                pr.cluster.hardware)
    assert got[8, meta].peak_memory_GB == pytest.approx(hand / 1e9, rel=2e-3)


def test_band_of_saved_sets_is_a_product_and_checked():
    """`band:` keys multiply (3 V x 2 sets, V outermost, in the file's order); a set naming a
    module the cost model lacks is refused naming the table, the run and the key."""
    from nest.common.errors import SpecError
    from nest.fidelity.published_runs import band_members, load_runs, training_for

    row = next(r for r in load_runs() if r["id"] == "llama3_405b_16384gpu")
    got = [(m["virtual_stages"], m["recompute_modules"]) for m in band_members(row)]
    assert got == [(v, s) for v in (2, 4, 8) for s in ([], ["layernorm", "act"])]
    bad = dict(row, band={"recompute_modules": [["layernorm", "mlp"]]})
    with pytest.raises(SpecError, match=r"run 'llama3_405b_16384gpu': key 'recompute_modules'"):
        training_for(band_members(bad)[0])
