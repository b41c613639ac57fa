"""The kernel-name classifier (reports/kernels.py) and the trace reader (reports/profile_trace.py): public kernel
names, launch context, idle/overlap arithmetic on a synthetic Kineto trace, and the recorded traces in
tests/data/traces/ (a CPU trace of the bundled trainer; H200 traces of the MoE proxy when recorded)."""

from __future__ import annotations

from pathlib import Path

import pytest

from reports import kernels as k
from reports.profile_trace import breakdown_of, load_events, union_length

TRACES = Path(__file__).parent / "data" / "traces"

# Names as cuBLAS/cuBLASLt, CUTLASS, flash/cuDNN, NCCL, DeepEP, Transformer Engine, Triton/Inductor and
# PyTorch's own kernels print them in H100/H200 traces.
PUBLIC_NAMES = {
    "nvjet_tst_128x256_64x4_2x1_v_bz_coopA_NNT": k.GEMM,
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas": k.GEMM,
    "void cutlass::device_kernel<at::cuda::detail::enable_3x_kernel_for_sm9x<cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::GroupProblemShape<cute::tuple<int, int, int> >, cutlass::bfloat16_t> > >(...)": k.GEMM,
    "cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_nn_align8>(...)": k.GEMM,
    "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_tn": k.GEMM,
    "void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float>(...)": k.GEMM,
    "triton_tem_fused_mm_0": k.GEMM,
    "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t> >(...)": k.ATTENTION,
    "void flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<...>(Flash_bwd_params)": k.ATTENTION,
    "fmha_cutlassF_bf16_aligned_64x128_rf_sm80(PyTorchMemEffAttention::AttentionKernel<...>::Params)": k.ATTENTION,
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1_kspt0_wspt1": k.ATTENTION,
    "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)": k.COMMUNICATION,
    "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)": k.COMMUNICATION,
    "ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclWorkElem)": k.COMMUNICATION,
    "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)": k.COMMUNICATION,
    "void deep_ep::intranode::dispatch<8, 768, 8192>(...)": k.MOE_EXCHANGE,
    "void deep_ep::internode::combine<...>(...)": k.MOE_EXCHANGE,
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>, ...>(...)": k.OPTIMIZER,
    "void multi_tensor_apply_kernel<TensorListMetadata<2>, L2NormFunctor<float, float, float>, float*>(...)": k.OPTIMIZER,
    "void at::native::indexSelectLargeIndex<c10::BFloat16, long, unsigned int, 2, 2, -2, true>(...)": k.MOE_PERMUTE,
    "void at::native::_scatter_gather_elementwise_kernel<128, 8, ...>(int, ...)": k.MOE_PERMUTE,
    "void at::native::vectorized_gather_kernel<16, long>(char*, char*, long*, int, long, long, long, long, bool)": k.MOE_PERMUTE,
    "void at_cuda_detail::cub::DeviceRadixSortOnesweepKernel<...>(...)": k.MOE_PERMUTE,
    "void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>(...)": k.MOE_PERMUTE,
    "_permute_kernel": k.MOE_PERMUTE,
    # names from the H200 traces in tests/data/traces/
    "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, ...>(...)": k.ELEMENTWISE,
    "triton_poi_fused__to_copy_add_copy__div_eq_lerp_mul_pow_rsub_sqrt_sub_unbind_where_0": k.OPTIMIZER,
    "triton_poi_fused_cat_mul_silu_silu_backward_split_5": k.ELEMENTWISE,
    "triton_per_fused_index_select_sum_view_6": k.MOE_PERMUTE,
    "void cudnn::fusion::compute_dot_do_o_specialized<true, 128>(void const*, void const*, void*, void*, unsigned int)": k.ATTENTION,
    "void cudnn::fusion::convert_dq_to_16bits<true>(void const*, void*, unsigned int, unsigned int, unsigned int)": k.ATTENTION,
    "void cudnn::fusion::fmha_reduce_head<true>(void const*, void*, unsigned int, unsigned int, unsigned int)": k.ATTENTION,
    "void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernelTemplate<c10::BFloat16, float, 32u, 32u, 256u>(...)": k.ELEMENTWISE,
    "_ZN7cutlass13device_kernelIN2at4cuda6detail25enable_3x_kernel_for_sm9xINS_4gemm6kernel13GemmUniversalINS5_17GroupProblemShape": k.GEMM,
    "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT": k.GEMM,
    "void at::native::tensor_kernel_scan_innermost_dim<long, std::plus<long> >(long*, long const*, unsigned int, unsigned int, unsigned int, long, std::plus<long>)": k.MOE_PERMUTE,
    "void at::native::(anonymous namespace)::compute_grad_weight<c10::BFloat16, float, long>(...)": k.OTHER,
    "void at::native::(anonymous namespace)::krn_partials_per_segment<long>(long*, long const*, long, long)": k.OTHER,
    "void at::native::(anonymous namespace)::embedding_backward_feature_kernel<float, float, long>(...)": k.OTHER,
    "_unpermute_kernel": k.MOE_PERMUTE,
    "_make_row_id_map_kernel": k.MOE_PERMUTE,
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, ...>(...)": k.ELEMENTWISE,
    "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(...)>(...)": k.ELEMENTWISE,
    "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>(...)": k.ELEMENTWISE,
    "void transformer_engine::normalization::rmsnorm_fwd_tuned_kernel<...>(...)": k.ELEMENTWISE,
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<...> > >(...)": k.ELEMENTWISE,
    "triton_poi_fused_mul_silu_0": k.ELEMENTWISE,
    "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_1": k.ELEMENTWISE,
    "void (anonymous namespace)::softmax_warp_forward<float, float, float, 11, true, false>(...)": k.ELEMENTWISE,
    "Memcpy DtoD (Device -> Device)": k.MEMCPY,
    "Memset (Device)": k.MEMCPY,
    "aten::mm": k.GEMM,
    "aten::_grouped_mm": k.GEMM,
    "aten::_scaled_dot_product_flash_attention_for_cpu": k.ATTENTION,
    "aten::_fused_adamw_": k.OPTIMIZER,
    "aten::index_select": k.MOE_PERMUTE,
    "aten::mul": k.ELEMENTWISE,
    "some_new_kernel_nobody_knows": k.OTHER,
}


@pytest.mark.parametrize("name,expected", sorted(PUBLIC_NAMES.items()))
def test_public_kernel_names(name, expected):
    assert k.classify(name) == expected


def test_context_refines_only_generic_kernels():
    add = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>(...)"
    assert k.classify(add, ("aten::add_", "Optimizer.step#AdamW.step", "ProfilerStep#8")) == k.OPTIMIZER
    assert k.classify(add, ("aten::index_put_", "moe_combine")) == k.MOE_PERMUTE  # innermost wins
    send = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
    assert k.classify(send, ("nccl:all_to_all", "c10d::alltoall_base_")) == k.MOE_EXCHANGE
    allreduce = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(...)"
    assert k.classify(allreduce, ("Optimizer.step#AdamW.step",)) == k.COMMUNICATION  # not optimizer work
    gemm = "nvjet_tst_128x256_64x4_2x1_v_bz_coopA_NNT"
    assert k.classify(gemm, ("Optimizer.step#AdamW.step", "moe_dispatch")) == k.GEMM
    index = "void at::native::indexSelectLargeIndex<float, long, unsigned int, 2, 2, -2, true>(...)"
    assert k.classify(index, ("aten::index_select", "aten::embedding")) == k.OTHER  # the embedding, not MoE
    assert k.classify(index, ("aten::index_select", "moe_dispatch")) == k.MOE_PERMUTE


def _x(cat, name, ts, dur, tid=1, **args):
    if cat == "kernel":  # as Kineto writes GPU events: pid = device, tid = stream
        return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": tid, "ts": ts, "dur": dur,
                "args": {"device": 0, "stream": tid, **args}}  # fmt: skip
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def synthetic_gpu_trace() -> list[dict]:
    """Two 100-µs steps; in each a GEMM (0-40), an all-to-all beside it on another stream (30-60: 10 µs
    overlapped), an elementwise kernel of the optimizer (70-80); idle 40 % of the step."""
    events = []
    for step, base in ((8, 1000.0), (9, 1100.0)):
        events.append(_x("user_annotation", f"ProfilerStep#{step}", base, 100.0))
        events.append(_x("cpu_op", "aten::mm", base + 1, 2))
        events.append(_x("cuda_runtime", "cudaLaunchKernel", base + 1.5, 0.5, correlation=step * 10 + 1))
        events.append(_x("cpu_op", "c10d::alltoall_base_", base + 4, 3))
        events.append(_x("cpu_op", "nccl:all_to_all", base + 4.5, 2))
        events.append(_x("cuda_runtime", "cudaLaunchKernel", base + 5, 0.5, correlation=step * 10 + 2))
        events.append(_x("user_annotation", "Optimizer.step#AdamW.step", base + 60, 20))
        events.append(_x("cpu_op", "aten::add_", base + 61, 2))
        events.append(_x("cuda_runtime", "cudaLaunchKernel", base + 61.5, 0.5, correlation=step * 10 + 3))
        gemm = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_cublas"
        events.append(_x("kernel", gemm, base + 0, 40, tid=7, correlation=step * 10 + 1))
        events.append(
            _x("kernel", "ncclDevKernel_SendRecv(...)", base + 30, 30, tid=20, correlation=step * 10 + 2)
        )
        gpu_range = {"ph": "X", "cat": "gpu_user_annotation", "pid": 0, "tid": 7}  # as Kineto mirrors ranges
        events.append({**gpu_range, "name": f"ProfilerStep#{step}", "ts": base, "dur": 80.0})
        events.append({**gpu_range, "name": "Optimizer.step#AdamW.step", "ts": base + 70, "dur": 10.0})
        add = "void at::native::vectorized_elementwise_kernel<4, CUDAFunctor_add<float>>(...)"
        events.append(_x("kernel", add, base + 70, 10, tid=7, correlation=step * 10 + 3))
    return events


def test_synthetic_gpu_trace_idle_overlap_context():
    found = breakdown_of(synthetic_gpu_trace())
    assert found.device == "gpu" and found.steps == 2 and found.window_ms == pytest.approx(0.1)
    c = found.classes
    assert c[k.GEMM] == pytest.approx(0.040)
    assert c[k.MOE_EXCHANGE] == pytest.approx(0.030)  # an NCCL send/recv launched under all_to_all
    assert c[k.OPTIMIZER] == pytest.approx(0.010)  # an add launched inside Optimizer.step
    assert c[k.IDLE] == pytest.approx(0.030)  # busy 0-60 and 70-80 of 100 µs
    assert found.overlap_ms == pytest.approx(0.010)
    assert found.exposed_comm_ms == pytest.approx(0.020)
    assert sum(c.values()) - found.overlap_ms == pytest.approx(found.window_ms)


def test_union_length():
    import numpy as np

    starts, ends = np.array([5.0, 0.0, 1.0, 20.0]), np.array([7.0, 3.0, 2.0, 21.0])
    assert union_length(starts, ends) == pytest.approx(6.0)
    assert union_length(np.array([]), np.array([])) == 0.0


def recorded_traces() -> list[Path]:
    return sorted(p for p in TRACES.glob("*") if p.name.endswith((".json", ".json.gz")))


@pytest.mark.parametrize("path", recorded_traces(), ids=lambda p: p.name)
def test_recorded_traces_classify(path):
    """Every recorded trace: time adds up to the window, little is unknown, and GEMM work is found."""
    found = breakdown_of(load_events(path), source=str(path))
    c = found.classes
    assert set(c) <= set(k.ALL_CLASSES)
    assert sum(c.values()) - found.overlap_ms == pytest.approx(found.window_ms, rel=1e-6)
    work = sum(v for cls, v in c.items() if cls != k.IDLE)
    assert c.get(k.GEMM, 0.0) > 0.1 * work, c
    assert c.get(k.OTHER, 0.0) < 0.15 * work, (c, found.top.get(k.OTHER))
    assert c.get(k.OPTIMIZER, 0.0) > 0 and c.get(k.ATTENTION, 0.0) > 0, c


def test_holistic_trace_analysis_agrees(tmp_path):
    """HTA (reports/profile_hta.py) on the same trace: its compute/communication overlap is what the reader's
    exposed communication implies (10 of 30 µs), and the compute stream's idle time is explained by cause."""
    pytest.importorskip("hta")
    import json

    from reports.profile_hta import hta_figures

    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": synthetic_gpu_trace()}))
    found = breakdown_of(synthetic_gpu_trace())
    hta = hta_figures(path, steps=2)
    assert hta is not None
    comm = found.classes[k.MOE_EXCHANGE]
    assert hta["comm_overlap_pct"] == pytest.approx(100 * (1 - found.exposed_comm_ms / comm), abs=0.01)
    idle = hta["idle_host_wait_ms"] + hta["idle_kernel_wait_ms"] + hta["idle_other_ms"]
    assert idle == pytest.approx(0.035)  # the GEMM stream: 40-70 and 80-100 µs of each step, per step


def test_gpu_only_trace_uses_gpu_side_ranges():
    """A trace cut down to GPU events (as the first recorded H200 traces are) has no CPU stack: the
    optimizer's kernels are still found by the GPU-side annotation range around them."""
    events = synthetic_gpu_trace()
    gpu_only = [e for e in events if e["cat"] in ("kernel", "gpu_user_annotation")
                or str(e["name"]).startswith("ProfilerStep#")]  # fmt: skip
    full, cut = breakdown_of(events), breakdown_of(gpu_only)
    assert cut.steps == 2 and cut.window_ms == pytest.approx(full.window_ms)
    assert cut.classes[k.OPTIMIZER] == pytest.approx(full.classes[k.OPTIMIZER])
    assert cut.classes[k.GEMM] == pytest.approx(full.classes[k.GEMM])
    assert cut.classes[k.IDLE] == pytest.approx(full.classes[k.IDLE])
    # the all-to-all was known only from its CPU op: without it, the NCCL kernel is plain communication
    assert cut.classes[k.COMMUNICATION] == pytest.approx(full.classes[k.MOE_EXCHANGE])


def test_trim_trace_keeps_what_the_classifier_reads():
    """benchmarks/trim_trace.py (how H200 traces are kept here) loses no figure of the breakdown."""
    from benchmarks.trim_trace import trim

    events = synthetic_gpu_trace()
    full, cut = breakdown_of(events), breakdown_of(trim(events))
    assert cut.classes == pytest.approx(full.classes) and cut.exposed_comm_ms == pytest.approx(
        full.exposed_comm_ms
    )


def test_h200_dispatch_chunking_moves_time():
    """The H200 slice traces (benchmarks/h200_session5.sh a): with dispatch chunking on a 16-SM dispatcher the
    MoE permutation runs on a side stream beside the expert GEMMs, so kernel time overlaps where it did not."""
    base, chunked = TRACES / "slice_base.trace.json.gz", TRACES / "slice_chunk_sms.trace.json.gz"
    if not (base.exists() and chunked.exists()):
        pytest.skip("H200 slice traces not recorded in tests/data/traces/")
    before, after = breakdown_of(load_events(base)), breakdown_of(load_events(chunked))
    assert before.device == after.device == "gpu"
    assert after.overlap_ms > before.overlap_ms + 0.05 * after.classes[k.MOE_PERMUTE], (before, after)
    try:
        import hta  # noqa: F401
    except ImportError:
        return
    from reports.profile_hta import hta_figures

    # and HTA says why the step got longer: the GPU waits on the host launching the chunks' kernels
    idle_before, idle_after = hta_figures(base, 1), hta_figures(chunked, 1)
    assert idle_before is not None and idle_after is not None
    assert idle_after["idle_host_wait_ms"] > 2 * idle_before["idle_host_wait_ms"], (idle_before, idle_after)


def test_h200_dispatch_campaign_shows_where_the_time_moved():
    """The dispatch campaign's own traces on the H200 (`profile:` steps 3-4, CPU ranges kept: the dispatcher's
    kernels are told apart from the permutation's by what launched them): a 16-SM green-context dispatcher makes
    dispatch/combine and permute kernels slower (fewer SMs), chunking adds host-launch idle and, with the side
    stream, overlap beside the GEMMs."""
    names = {n: TRACES / f"dispatch_{n}.trace.json.gz" for n in ("base", "sms16", "chunk2048_sms16")}
    found = {n: breakdown_of(load_events(p)) for n, p in names.items()}
    base, sms, both = (found[n].classes for n in names)
    exchange = k.MOE_EXCHANGE
    assert sms[exchange] > 3 * base[exchange] and sms[k.MOE_PERMUTE] > 3 * base[k.MOE_PERMUTE], (base, sms)
    assert found["base"].overlap_ms < 1.0 < 10.0 < found["chunk2048_sms16"].overlap_ms
    assert both[k.GEMM] > 1.5 * base[k.GEMM]  # the expert GEMMs share the GPU with the dispatcher
    assert abs(sms[k.ATTENTION] - base[k.ATTENTION]) < 0.1 * base[k.ATTENTION]  # attention did not move
