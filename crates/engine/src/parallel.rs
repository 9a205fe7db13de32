//! Fork-join for the CPU kernels: each parallel region hands a list of tasks to every core.
//!
//! A decode step is ~150 short regions (q/k/v, attention, the output projection, gate/up and
//! down for each of 30 layers), so what a region costs to start and end matters as much as
//! the arithmetic. rayon's threads sleep on a futex a few microseconds after their work runs
//! out; in a browser waking one (`Atomics.notify` to another Web Worker) cost about as much as
//! a region's work, and two threads decoded no faster than one. This pool's workers spin
//! between regions instead, as llama.cpp's do, and sleep only after about a millisecond idle;
//! the caller works too. Measured against rayon natively on 2 cores (BENCHMARKS.md) it also
//! prefilled faster, so it serves both.
//!
//! Natively the workers start with the first region: `STRADDLE_THREADS` threads in all (the
//! cores by default). In the threaded browser build, each pool Web Worker calls
//! [`pool::join`]; without workers the regions run on the caller.

/// Runs `work` on every item, the items spread over the pool; returns when all are done.
pub(crate) fn for_each<T: Send>(items: Vec<T>, work: impl Fn(T) + Sync) {
    #[cfg(any(not(target_arch = "wasm32"), feature = "threads"))]
    pool::for_each(items, work);
    #[cfg(all(target_arch = "wasm32", not(feature = "threads")))]
    items.into_iter().for_each(work);
}

/// Runs every task, the tasks spread over the pool (in order on one thread); each writes its
/// own result where it captured a place for it.
pub(crate) fn run_all<'a>(tasks: Vec<Box<dyn FnOnce() + Send + 'a>>) {
    for_each(tasks, |task| task());
}

/// Threads the CPU kernels run on (the caller and the pool's workers).
pub fn threads() -> usize {
    #[cfg(any(not(target_arch = "wasm32"), feature = "threads"))]
    return pool::threads();
    #[cfg(all(target_arch = "wasm32", not(feature = "threads")))]
    1
}

#[cfg(any(not(target_arch = "wasm32"), feature = "threads"))]
pub mod pool {
    //! The pool: one region at a time, claimed task by task by the caller and the workers.

    use std::mem::ManuallyDrop;
    use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicUsize, Ordering::SeqCst};
    use std::sync::{Condvar, Mutex, TryLockError};

    /// Spins (atomic loads) a worker makes before it sleeps: about a millisecond, longer than
    /// the serial stretches between a decode step's regions, far shorter than a reply's pauses.
    const SPINS_BEFORE_SLEEP: u32 = 1 << 20;

    /// One parallel region: tasks `0..tasks`, claimed one at a time.
    struct Region {
        run: *const (dyn Fn(usize) + Sync),
        tasks: usize,
        next: AtomicUsize,
        done: AtomicUsize,
        panicked: AtomicBool,
    }

    struct Shared {
        /// Bumped for each region; workers watch it.
        epoch: AtomicU32,
        /// The current region while its caller waits for it, else null.
        region: AtomicPtr<Region>,
        /// Workers that have joined.
        workers: AtomicUsize,
        /// Workers between loading `region` and being done with it.
        inside: AtomicUsize,
        sleepers: AtomicUsize,
        sleep: Mutex<()>,
        wake: Condvar,
        /// Held by the caller of the current region: one region at a time.
        caller: Mutex<()>,
    }

    static SHARED: Shared = Shared {
        epoch: AtomicU32::new(0),
        region: AtomicPtr::new(std::ptr::null_mut()),
        workers: AtomicUsize::new(0),
        inside: AtomicUsize::new(0),
        sleepers: AtomicUsize::new(0),
        sleep: Mutex::new(()),
        wake: Condvar::new(),
        caller: Mutex::new(()),
    };

    /// Threads working on parallel regions: the caller and the workers that joined.
    pub fn threads() -> usize {
        #[cfg(not(target_arch = "wasm32"))]
        start_native_workers();
        SHARED.workers.load(SeqCst) + 1
    }

    /// Natively, the workers are threads of our own, started once.
    #[cfg(not(target_arch = "wasm32"))]
    fn start_native_workers() {
        static STARTED: std::sync::Once = std::sync::Once::new();
        STARTED.call_once(|| {
            let threads = std::env::var("STRADDLE_THREADS")
                .ok()
                .and_then(|v| v.parse::<usize>().ok())
                .filter(|&n| n >= 1)
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
            for i in 1..threads {
                let started = std::thread::Builder::new()
                    .name(format!("straddle-pool-{i}"))
                    .spawn(|| join());
                if let Err(e) = started {
                    tracing::warn!(error = %e, "a CPU pool thread did not start");
                }
            }
            // Regions may start before the workers count themselves in; they would simply
            // run on fewer threads, but a benchmark's first pass should see them all.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
            while SHARED.workers.load(SeqCst) + 1 < threads && std::time::Instant::now() < deadline
            {
                std::thread::yield_now();
            }
        });
    }

    /// Makes the calling thread a worker of the pool, for good (it never returns).
    pub fn join() -> ! {
        let s = &SHARED;
        let mut seen = s.epoch.load(SeqCst);
        s.workers.fetch_add(1, SeqCst);
        loop {
            let mut spins = 0u32;
            while s.epoch.load(SeqCst) == seen {
                spins += 1;
                if spins < SPINS_BEFORE_SLEEP {
                    std::hint::spin_loop();
                    continue;
                }
                // The caller bumps `epoch` before reading `sleepers` and we count ourselves
                // before reading `epoch` (all SeqCst): one of us sees the other, so no wake-up
                // is lost.
                let mut guard = s.sleep.lock().unwrap_or_else(|e| e.into_inner());
                s.sleepers.fetch_add(1, SeqCst);
                while s.epoch.load(SeqCst) == seen {
                    guard = s.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
                }
                s.sleepers.fetch_sub(1, SeqCst);
                spins = 0;
            }
            seen = s.epoch.load(SeqCst);
            s.inside.fetch_add(1, SeqCst);
            let region = s.region.load(SeqCst);
            if !region.is_null() {
                // SAFETY: the caller keeps the region alive until `inside` drops to zero, and
                // we counted ourselves in before loading the pointer.
                work_on(unsafe { &*region });
            }
            s.inside.fetch_sub(1, SeqCst);
        }
    }

    fn work_on(region: &Region) {
        loop {
            let i = region.next.fetch_add(1, SeqCst);
            if i >= region.tasks {
                return;
            }
            // SAFETY: `run` outlives the region (see `run`). A panicking task still counts as
            // done, so the caller never waits for it, and the caller panics in its place.
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe {
                (*region.run)(i)
            }));
            if ran.is_err() {
                region.panicked.store(true, SeqCst);
            }
            region.done.fetch_add(1, SeqCst);
        }
    }

    /// Runs `run(i)` for every `i` in `0..tasks` on the caller and the workers. A second
    /// caller while a region runs (a server's other thread) runs its tasks alone.
    pub fn run(tasks: usize, run: &(dyn Fn(usize) + Sync)) {
        let s = &SHARED;
        let guard = if tasks <= 1 || threads() == 1 {
            None
        } else {
            match s.caller.try_lock() {
                Ok(guard) => Some(guard),
                // A region that panicked left nothing half-done: the lock guards no data.
                Err(TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
                Err(TryLockError::WouldBlock) => None,
            }
        };
        let Some(guard) = guard else {
            (0..tasks).for_each(run);
            return;
        };
        // SAFETY: only the lifetime is erased; the pointer is not used after this call
        // returns (we wait for every task and for every worker to leave the region).
        let run: *const (dyn Fn(usize) + Sync + 'static) = unsafe { std::mem::transmute(run) };
        let region = Region {
            run,
            tasks,
            next: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
        };
        s.region
            .store(&region as *const Region as *mut Region, SeqCst);
        s.epoch.fetch_add(1, SeqCst);
        if s.sleepers.load(SeqCst) > 0 {
            let _sleep = s.sleep.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        work_on(&region);
        wait_until(|| region.done.load(SeqCst) >= tasks);
        s.region.store(std::ptr::null_mut(), SeqCst);
        wait_until(|| s.inside.load(SeqCst) == 0);
        drop(guard);
        if region.panicked.load(SeqCst) {
            panic!("a task of a parallel region panicked");
        }
    }

    /// Spins until `done()`; natively it lets the OS run others after a while, in case a
    /// worker holding the last task was descheduled (more runnable threads than cores).
    fn wait_until(done: impl Fn() -> bool) {
        let mut spins = 0u32;
        while !done() {
            spins = spins.wrapping_add(1);
            #[cfg(not(target_arch = "wasm32"))]
            if spins.is_multiple_of(4096) {
                std::thread::yield_now();
                continue;
            }
            std::hint::spin_loop();
        }
    }

    /// [`super::for_each`] on the pool: each item is taken by exactly one task.
    pub fn for_each<T: Send>(items: Vec<T>, work: impl Fn(T) + Sync) {
        let mut items = ManuallyDrop::new(items);
        let (ptr, len) = (SendPtr(items.as_mut_ptr()), items.len());
        run(len, &|i| {
            // SAFETY: `run` hands out each index once, so each item is moved out once; the
            // vector's buffer is freed below without dropping them again.
            work(unsafe { ptr.get().add(i).read() })
        });
        // SAFETY: every item was moved out (a panicking task's item was dropped by the
        // unwinding); only the allocation remains.
        unsafe {
            items.set_len(0);
            ManuallyDrop::drop(&mut items);
        }
    }

    /// A raw pointer the tasks share; each reads a different element.
    struct SendPtr<T>(*mut T);
    // SAFETY: elements are moved out at distinct indices, one thread each.
    unsafe impl<T: Send> Sync for SendPtr<T> {}
    impl<T> SendPtr<T> {
        fn get(&self) -> *mut T {
            self.0
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::pool;

    #[test]
    fn the_pool_runs_every_task_once_with_workers_spinning_and_sleeping() {
        if pool::threads() < 2 {
            eprintln!("one core: the pool has no workers to test");
            return;
        }
        let caller = std::thread::current().id();
        let on_worker = AtomicUsize::new(0);
        for round in 0..200 {
            let tasks = round % 37;
            let hits: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
            let items: Vec<(usize, String)> = (0..tasks).map(|i| (i, i.to_string())).collect();
            pool::for_each(items, |(i, s)| {
                assert_eq!(s, i.to_string());
                hits[i].fetch_add(1, Ordering::SeqCst);
                if std::thread::current().id() != caller {
                    on_worker.fetch_add(1, Ordering::SeqCst);
                }
                std::thread::sleep(std::time::Duration::from_micros(20));
            });
            assert!(hits.iter().all(|h| h.load(Ordering::SeqCst) == 1));
            if round == 100 {
                // Long enough for the workers to go to sleep: the next region must wake them.
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        }
        assert!(
            on_worker.load(Ordering::SeqCst) > 0,
            "no worker took a task"
        );
    }

    #[test]
    fn run_all_leaves_each_result_in_its_own_place() {
        let mut places: Vec<Option<String>> = vec![None; 29];
        let mut side = None;
        let mut tasks: Vec<Box<dyn FnOnce() + Send + '_>> =
            vec![Box::new(|| side = Some("side".to_string()))];
        tasks.extend(places.iter_mut().enumerate().map(|(i, place)| {
            Box::new(move || *place = Some(i.to_string())) as Box<dyn FnOnce() + Send + '_>
        }));
        super::run_all(tasks);
        assert_eq!(side.as_deref(), Some("side"));
        let expected: Vec<Option<String>> = (0..29).map(|i| Some(i.to_string())).collect();
        assert_eq!(places, expected);
    }

    #[test]
    fn a_panicking_task_panics_its_caller_and_the_pool_goes_on() {
        let r = std::panic::catch_unwind(|| {
            pool::for_each((0..64).collect::<Vec<usize>>(), |i| {
                assert_ne!(i, 17, "task 17 fails");
            })
        });
        assert!(r.is_err());
        let sum = AtomicUsize::new(0);
        pool::for_each((0..64).collect::<Vec<usize>>(), |i| {
            sum.fetch_add(i, Ordering::SeqCst);
        });
        assert_eq!(sum.load(Ordering::SeqCst), 64 * 63 / 2);
    }
}
