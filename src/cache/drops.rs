//! Letting go of many entries at once (a sweep, a clear, a front let go of) without holding
//! up the thread that serves clients.
//!
//! Dropped at once, a sweep's 100,000 entries are as many cache misses in a row. Dropped on a
//! blocking thread instead, as they were, each free of a block the serving thread allocated
//! goes on that block's page's list of frees from other threads, and mimalloc takes those
//! lists back on the owning thread, walking each one, at its next collection (every 10,000
//! allocations that miss its fast path): right after a load switched from Zipf GETs to the
//! 90/10 mix, one such collection held corral's only thread for 33-37 ms in each of five runs
//! (perf: `_mi_page_free_collect` under `_mi_malloc_generic`). So they are dropped on the
//! runtime, [`STEP`] at a time, the task yielding between steps. Out of the store, they no
//! longer count against its budget while they wait: a clear of the largest store holds its
//! memory a few more milliseconds.

/// Items dropped between two yields: about 0.1-0.3 ms of cache misses for entries.
const STEP: usize = 1024;

/// Drops `items` a [`STEP`] at a time on the current runtime (from a blocking thread too),
/// yielding between steps; at once where there is no runtime.
pub(super) fn drop_in_steps<T: Send + 'static>(items: Vec<T>) {
    if !items.is_empty() {
        in_steps(items, drop);
    }
}

/// Hands each of `items` to `each`, a [`STEP`] at a time on the current runtime (from a
/// blocking thread too), yielding between steps; all at once where there is no runtime.
pub(super) fn in_steps<I>(items: I, mut each: impl FnMut(I::Item) + Send + 'static)
where
    I: IntoIterator<IntoIter: Send + 'static>,
{
    let mut items = items.into_iter();
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => drop(rt.spawn(async move {
            loop {
                let mut n = 0;
                for item in items.by_ref().take(STEP) {
                    each(item);
                    n += 1;
                }
                if n < STEP {
                    return;
                }
                tokio::task::yield_now().await;
            }
        })),
        Err(_) => items.for_each(each),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::thread::{self, ThreadId};

    use super::*;

    /// Records the thread it is dropped on.
    struct Noted(Arc<Mutex<Vec<ThreadId>>>);

    impl Drop for Noted {
        fn drop(&mut self) {
            if let Ok(mut on) = self.0.lock() {
                on.push(thread::current().id());
            }
        }
    }

    fn noted(n: usize) -> (Vec<Noted>, Arc<Mutex<Vec<ThreadId>>>) {
        let on = Arc::new(Mutex::new(Vec::new()));
        ((0..n).map(|_| Noted(on.clone())).collect(), on)
    }

    fn dropped(on: &Mutex<Vec<ThreadId>>) -> Vec<ThreadId> {
        on.lock().map(|v| v.clone()).unwrap_or_default()
    }

    #[tokio::test]
    async fn items_are_dropped_a_step_at_a_time_with_other_tasks_run_between() {
        let (items, on) = noted(3 * STEP + 1);
        drop_in_steps(items);
        let mut seen = vec![dropped(&on).len()];
        for _ in 0..1000 {
            tokio::task::yield_now().await;
            seen.push(dropped(&on).len());
            if seen.last() == Some(&(3 * STEP + 1)) {
                break;
            }
        }
        assert_eq!(seen, [0, STEP, 2 * STEP, 3 * STEP, 3 * STEP + 1]);
    }

    #[tokio::test]
    async fn items_let_go_of_on_a_blocking_thread_are_dropped_on_the_runtime() {
        let runtime_thread = thread::current().id();
        let (items, on) = noted(3 * STEP + 1);
        tokio::task::spawn_blocking(move || drop_in_steps(items))
            .await
            .unwrap();
        for _ in 0..1000 {
            if dropped(&on).len() == 3 * STEP + 1 {
                break;
            }
            tokio::task::yield_now().await;
        }
        let on = dropped(&on);
        assert_eq!(on.len(), 3 * STEP + 1);
        assert!(on.iter().all(|&t| t == runtime_thread));
    }

    #[test]
    fn without_a_runtime_items_are_dropped_at_once() {
        let (items, on) = noted(2 * STEP);
        drop_in_steps(items);
        assert_eq!(dropped(&on).len(), 2 * STEP);
    }
}
