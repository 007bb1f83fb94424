//! Spreading a batch's work over threads and freeing what it displaced off the critical path.

use super::*;

/// Fewest items per thread worth a thread of its own.
pub(super) const MIN_ITEMS_PER_THREAD: usize = 32;

/// How many of up to `threads` threads `items` items are worth.
pub(super) fn threads_for(items: usize, threads: usize) -> usize {
    threads.min(items / MIN_ITEMS_PER_THREAD).max(1)
}

/// `one` of every element of `items`, in order, computed on up to `threads` threads (the calling
/// one included). Pure CPU work over shared read-only input. The elements of a chunk whose
/// thread panicked are `None` (the caller does them itself or goes without).
pub(super) fn map_in_parallel<T: Sync, R: Send>(
    items: &[T],
    threads: usize,
    one: impl Fn(&T) -> Option<R> + Sync,
) -> Vec<Option<R>> {
    let threads = threads_for(items.len(), threads);
    if threads == 1 {
        return items.iter().map(one).collect();
    }
    let chunk = items.len().div_ceil(threads);
    let one = &one;
    std::thread::scope(|scope| {
        let mut chunks = items.chunks(chunk);
        let first = chunks.next().unwrap_or_default();
        let others: Vec<_> = chunks
            .map(|c| {
                (
                    c.len(),
                    scope.spawn(move || c.iter().map(one).collect::<Vec<_>>()),
                )
            })
            .collect();
        let mut all: Vec<Option<R>> = first.iter().map(one).collect();
        for (len, handle) in others {
            match handle.join() {
                Ok(results) => all.extend(results),
                Err(_) => {
                    tracing::error!("a status processing thread panicked");
                    all.extend(std::iter::repeat_with(|| None).take(len));
                }
            }
        }
        all
    })
}

/// Frees `values` on up to `threads` threads (the calling one included): a status is a tree of
/// small allocations, and a batch replaces hundreds of them.
pub fn free_in_parallel<T: Send>(mut values: Vec<T>, threads: usize) {
    let threads = threads_for(values.len(), threads);
    if threads == 1 {
        return;
    }
    let chunk = values.len().div_ceil(threads);
    let mut parts = Vec::with_capacity(threads - 1);
    while values.len() > chunk {
        parts.push(values.split_off(values.len() - chunk));
    }
    std::thread::scope(|scope| {
        for part in parts {
            scope.spawn(move || drop(part));
        }
        drop(values);
    });
}

/// Interprets the items of `batch` at `misses` (index and fingerprint, from
/// [`StatusState::misses`]) on up to `threads` threads (the calling one included). Each item's
/// result is its own, so the fold that follows keeps the batch's order whatever thread
/// interpreted what; an item missing here (its thread panicked) is interpreted by the fold.
pub fn interpret_items(
    batch: &StatusBatch,
    misses: &[(usize, Fingerprint)],
    interpreters: &Interpreters,
    threads: usize,
) -> HashMap<usize, Fresh> {
    map_in_parallel(misses, threads, |(i, print)| {
        let observed = batch.report.items.get(*i)?.observed.as_ref()?;
        Some((
            *i,
            Fresh::new(Interpreted::run(observed, *print, interpreters)),
        ))
    })
    .into_iter()
    .flatten()
    .collect()
}
