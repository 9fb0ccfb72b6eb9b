"""The GEMM's persistent thread pool, emitted as LLVM IR: per-call context allocation and
reference counting, the worker loop (POSIX threads, condition variable after a short
``sched_yield`` poll), and posting a call to the pool. A mixin of the GEMM emitter (``kernel.py``),
which provides ``mod``, ``p`` (the prefix), ``ctx_ty`` and ``field_ptr``."""
from __future__ import annotations

from llvmlite import ir

from .irbuild import FP, I1, I8, I8P, I32, I64, VOID, _declare, _Fn, _new_fn, c64


class PoolEmitter:
    # -- threads ------------------------------------------------------------------------------
    def emit_alloc(self, name):
        """alloc(ctx, slots): posix_memalign the two packing buffers; 1 on success (else both null)."""
        fn = _new_fn(self.mod, name, I1, [(self.ctx_ty.as_pointer(), "ctx"), (I8P.as_pointer(), "slots")])
        f = _Fn(fn)
        b = f.b
        ctx, slots = fn.args
        memalign = _declare(self.mod, "posix_memalign", I32, [I8P.as_pointer(), I64, I64])
        free = _declare(self.mod, "free", VOID, [I8P])
        ok = ir.Constant(I1, 1)
        for i, fld in enumerate(("abuf", "bbuf")):
            slot = b.gep(slots, [c64(i)])
            b.store(ir.Constant(I8P, None), slot)
            n = b.load(self.field_ptr(b, ctx, fld))
            rc = b.call(memalign, [slot, c64(64), b.mul(f.max(n, c64(1)), c64(4))])
            ok = b.and_(ok, b.icmp_signed("==", rc, ir.Constant(I32, 0)))
        with f.if_(b.not_(ok), "fail"):
            for i in range(2):
                slot = b.gep(slots, [c64(i)])
                b.call(free, [b.load(slot)])
                b.store(ir.Constant(I8P, None), slot)
        b.ret(ok)
        return fn

    def emit_run(self, name, task):
        """run(ctx, abuf, bbuf, slot): the tasks of range ``slot`` (mod the ranges), then those left in
        the other ranges in turn, each taken from its range's counter; adds the count done to ``done``
        once, at the end."""
        fn = _new_fn(self.mod, name, VOID, [(self.ctx_ty.as_pointer(), "ctx"), (FP, "abuf"),
                                           (FP, "bbuf"), (I64, "slot")])
        f = _Fn(fn)
        b = f.b
        ctx, abuf, bbuf, slot = fn.args
        g = {n: b.load(self.field_ptr(b, ctx, n)) for n in ("M", "N", "tm", "tn", "tiles_n", "ntasks", "nranges")}
        count = f.alloca(I64, name="count")
        b.store(c64(0), count)
        with f.loop(0, g["nranges"], 1, "r") as r:
            k = b.srem(b.add(slot, r), g["nranges"])
            end = b.sdiv(b.mul(b.add(k, c64(1)), g["ntasks"]), g["nranges"])
            claim = self.claim_ptr(b, ctx, k)
            head, body, done = f.block("w.head"), f.block("w.body"), f.block("w.done")
            # a finished range is only read: its line stays in its owner's cache
            b.cbranch(b.icmp_signed("<", b.load_atomic(claim, "monotonic", 8), end), head, done)
            b.position_at_end(head)
            t = b.atomic_rmw("add", claim, c64(1), "seq_cst")
            b.cbranch(b.icmp_signed("<", t, end), body, done)
            b.position_at_end(body)
            gi, gj = b.sdiv(t, g["tiles_n"]), b.srem(t, g["tiles_n"])
            ii0, jj0 = b.mul(gi, g["tm"]), b.mul(gj, g["tn"])
            ii1 = f.min(g["M"], b.add(ii0, g["tm"]))
            jj1 = f.min(g["N"], b.add(jj0, g["tn"]))
            b.call(task, [ctx, abuf, bbuf, ii0, ii1, jj0, jj1])
            b.store(b.add(b.load(count), c64(1)), count)
            b.branch(head)
            b.position_at_end(done)
        b.atomic_rmw("add", self.field_ptr(b, ctx, "done"), b.load(count), "seq_cst")
        b.ret_void()
        return fn

    def emit_release(self, name):
        """release(ctx): drop one reference to the heap context; the last one frees it."""
        fn = _new_fn(self.mod, name, VOID, [(self.ctx_ty.as_pointer(), "ctx")])
        f = _Fn(fn)
        b = f.b
        free = _declare(self.mod, "free", VOID, [I8P])
        old = b.atomic_rmw("sub", self.field_ptr(b, fn.args[0], "refs"), c64(1), "seq_cst")
        with f.if_(b.icmp_signed("==", old, c64(1)), "last"):
            b.call(free, [b.bitcast(fn.args[0], I8P)])
        b.ret_void()
        return fn

    def emit_pool_globals(self):
        """The thread pool's state (one pool per prefix, started lazily, threads never exit).

        mutex/cond: zero-filled storage (PTHREAD_*_INITIALIZER is all zeros in glibc and musl;
        64 bytes cover both). job: the context being computed or null; gen: bumped per job.
        """
        def glob(name, ty, align=8):
            g = ir.GlobalVariable(self.mod, ty, name=f"{self.p}.{name}")
            g.linkage = "internal"
            g.initializer = ir.Constant(ty, None)
            g.align = align
            return g

        self.g_mutex = glob("pool_mutex", ir.ArrayType(I8, 64), 64)
        self.g_cond = glob("pool_cond", ir.ArrayType(I8, 64), 64)
        self.g_job = glob("pool_job", I8P)
        self.g_gen = glob("pool_gen", I64)
        self.g_nworkers = glob("pool_nworkers", I64)
        m = self.mod
        self.f_lock = _declare(m, "pthread_mutex_lock", I32, [I8P])
        self.f_unlock = _declare(m, "pthread_mutex_unlock", I32, [I8P])
        self.f_wait = _declare(m, "pthread_cond_wait", I32, [I8P, I8P])
        self.f_bcast = _declare(m, "pthread_cond_broadcast", I32, [I8P])

    def _mutex(self, b):
        return b.bitcast(self.g_mutex, I8P)

    def _cond(self, b):
        return b.bitcast(self.g_cond, I8P)

    def emit_worker(self, name, alloc, run, release):
        """A pool thread: sleep on the condition variable until a new job is posted, join it if
        it still wants helpers (taking a reference to its context), compute tasks, repeat."""
        fn = _new_fn(self.mod, name, I8P, [(I8P, "arg")])
        f = _Fn(fn)
        b = f.b
        free = _declare(self.mod, "free", VOID, [I8P])
        slots = f.alloca(I8P, 2)
        my_gen = f.alloca(I64, name="my_gen")
        b.store(c64(0), my_gen)
        top = f.block("top")
        b.branch(top)
        b.position_at_end(top)
        if self.cfg.pool_spin:  # poll a little before sleeping: back-to-back GEMMs wake faster
            yield_ = _declare(self.mod, "sched_yield", I32, [])
            sh, sb, se = f.block("spin.head"), f.block("spin.body"), f.block("spin.end")
            pre = b.block
            b.branch(sh)
            b.position_at_end(sh)
            i = b.phi(I64, "spin")
            i.add_incoming(c64(0), pre)
            gen = b.load_atomic(self.g_gen, "monotonic", 8)
            fresh = b.icmp_signed("!=", gen, b.load(my_gen))
            b.cbranch(b.or_(fresh, b.icmp_signed(">=", i, c64(self.cfg.pool_spin))), se, sb)
            b.position_at_end(sb)
            b.call(yield_, [])
            i.add_incoming(b.add(i, c64(1)), sb)
            b.branch(sh)
            b.position_at_end(se)
        b.call(self.f_lock, [self._mutex(b)])
        whead, wbody, wend = f.block("wait.head"), f.block("wait.body"), f.block("wait.end")
        b.branch(whead)
        b.position_at_end(whead)
        same = b.icmp_signed("==", b.load(self.g_gen), b.load(my_gen))
        b.cbranch(same, wbody, wend)
        b.position_at_end(wbody)
        b.call(self.f_wait, [self._cond(b), self._mutex(b)])
        b.branch(whead)
        b.position_at_end(wend)
        b.store(b.load(self.g_gen), my_gen)
        job = b.load(self.g_job)
        has = b.icmp_unsigned("!=", job, ir.Constant(I8P, None))
        take_blk, after = f.block("take"), f.block("taken")
        took = f.alloca(I1, name="took")
        b.store(ir.Constant(I1, 0), took)
        b.cbranch(has, take_blk, after)
        b.position_at_end(take_blk)
        ctx = b.bitcast(job, self.ctx_ty.as_pointer())
        hp = self.field_ptr(b, ctx, "helpers")
        want = b.icmp_signed("<", b.load(hp), b.load(self.field_ptr(b, ctx, "max_helpers")))
        myslot = f.alloca(I64, name="slot")
        with f.if_(want, "join"):
            b.store(b.add(b.load(hp), c64(1)), hp)
            b.store(b.load(hp), myslot)  # helper h (from 1) takes range h first
            b.atomic_rmw("add", self.field_ptr(b, ctx, "refs"), c64(1), "seq_cst")
            b.store(ir.Constant(I1, 1), took)
        b.branch(after)
        b.position_at_end(after)
        b.call(self.f_unlock, [self._mutex(b)])
        with f.if_(b.load(took), "work"):
            ctx = b.bitcast(job, self.ctx_ty.as_pointer())
            with f.if_(b.call(alloc, [ctx, slots]), "ok"):
                abuf = b.load(b.gep(slots, [c64(0)]))
                bbuf = b.load(b.gep(slots, [c64(1)]))
                b.call(run, [ctx, b.bitcast(abuf, FP), b.bitcast(bbuf, FP), b.load(myslot)])
                b.call(free, [abuf])
                b.call(free, [bbuf])
            b.call(release, [ctx])
        b.branch(top)
        return fn
