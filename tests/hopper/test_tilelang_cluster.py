"""The wsf8c pair's gather mapping and cluster protocol check (CPU: pure Python and source text, no TileLang)."""


def test_half_gather_slots_cover_each_half_once_with_whole_rows_per_eight_lanes():
    """half_slot: the 128 gather threads' two passes cover the 32 rows x 8 pieces of their CTA's half exactly once,
    and eight consecutive lanes write one row (so a warp's stores into the peer are whole 128-byte rows)."""
    from dsa_runtime.plugins.cuda_hopper.tilelang.gather_fp8 import half_slot

    for rank in (0, 1):
        slots = [half_slot(g, rank, i) for i in (0, 1) for g in range(128)]
        assert sorted(slots) == [(rank * 32 + r, p) for r in range(32) for p in range(8)]
        for i in (0, 1):
            for g0 in range(0, 128, 8):
                rows = {half_slot(g, rank, i)[0] for g in range(g0, g0 + 8)}
                pieces = [half_slot(g, rank, i)[1] for g in range(g0, g0 + 8)]
                assert len(rows) == 1 and pieces == list(range(8))


def test_cluster_check_wants_the_sync_after_the_barrier_init():
    """cluster_problems: silent on kernels that store into no peer; names a two-CTA kernel whose barriers may be
    reached by the peer before they are initialised (CPU: the lines as TileLang writes them)."""
    from dsa_runtime.plugins.cuda_hopper.tilelang.cluster_push import cluster_problems

    store = "dsa_cvt8_both((&(((half_t*)kv_lat)[0])), delta, rbar, (&(lat8[0])), sc[0]);"
    init = "free[0].init(512);"
    assert cluster_problems(init) == []  # no peer stores: nothing to check
    assert cluster_problems("\n".join([init, "tl::cluster_sync();", store])) == []
    assert cluster_problems("\n".join([init, store])) == ["wsf8c: no cluster sync after the barriers are initialised"]
    assert cluster_problems("\n".join(["tl::cluster_sync();", init, store])) != []
