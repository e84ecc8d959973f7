//! Giving memory back: an allocator keeps what the process freed unless asked to return it, so a satellite that
//! let go of a large structure (the token encoder) would otherwise keep its peak RSS.

/// Return the allocators' free memory to the operating system: mimalloc's (the satellite binary's global
/// allocator, src/main.rs) and glibc's `malloc_trim` (what tests and benches linking the library use, and
/// what C libraries allocate with). Each is harmless when the other one holds the memory.
pub fn return_free_memory() {
    // SAFETY: mi_collect only walks mimalloc's own heaps; it takes no pointers from us.
    unsafe {
        libmimalloc_sys::mi_collect(true);
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists; it takes no pointers from us.
    unsafe {
        nix::libc::malloc_trim(0);
    }
}

/// The satellite's mimalloc options, which src/main.rs sets before mimalloc starts (see `tune_allocator` there):
/// the option (its index in `mi_option_e` of mimalloc v3's mimalloc.h, the version libmimalloc-sys builds by
/// default), the environment variable that overrides it, the value.
pub const ALLOCATOR_OPTIONS: [(libmimalloc_sys::mi_option_t, &str, std::os::raw::c_long); 2] =
    [(4, "MIMALLOC_ARENA_EAGER_COMMIT", 0), (15, "MIMALLOC_PURGE_DELAY", 10)];

/// How often [`purge_periodically`] lets the allocator purge.
pub const PURGE_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// Let mimalloc give back what is due, every `every`, for good (the serving satellite spawns it).
///
/// mimalloc returns freed pages to the OS only from inside an allocation or a free, once their purge delay
/// ([`ALLOCATOR_OPTIONS`]: 10 ms) has passed. A satellite that falls idle right after a burst (a discovery of
/// thousands of tools) never allocates again, and kept what the burst freed in its last milliseconds resident for
/// good: about 2 MiB after one server of 4,500 tools, a fifth of what its tools cost (docs/performance-history.md,
/// 2026-11-27 23:30).
/// Under load the allocator's own calls purge as often as this; it matters once the satellite is idle, and then
/// costs one wake-up every `every`.
pub async fn purge_periodically(every: std::time::Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        purge_due_memory();
    }
}

/// Return to the OS what mimalloc has held free for longer than its purge delay, and the calling thread's empty
/// pages. Cheap, unlike [`return_free_memory`], which purges everything at once whatever its age.
pub fn purge_due_memory() {
    // SAFETY: mi_collect only walks mimalloc's own heaps; it takes no pointers from us.
    unsafe {
        libmimalloc_sys::mi_collect(false);
    }
}

#[cfg(test)]
mod tests {
    /// The process's anonymous resident memory, in bytes.
    #[cfg(target_os = "linux")]
    fn resident() -> usize {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let kib = status
            .lines()
            .find_map(|line| line.strip_prefix("RssAnon:"))
            .and_then(|value| value.trim().trim_end_matches("kB").trim().parse::<usize>().ok());
        kib.unwrap_or(0) * 1024
    }

    /// Set in the process [`memory_a_burst_freed_goes_back_once_due_with_nothing_else_allocating`] runs itself in.
    #[cfg(target_os = "linux")]
    const BURST_CHILD: &str = "SATELLITE_TEST_MEMORY_BURST_CHILD";

    /// Memory a finished burst freed is given back by [`super::purge_due_memory`] once its purge delay is over,
    /// with no other allocation to do it: what an idle satellite relies on. Without it the pages stay resident.
    /// It runs again in a process of its own with the satellite's allocator options: a test binary starts mimalloc
    /// with its defaults, and its other tests allocate beside this one. Linux only: the options are set there
    /// (src/main.rs), and resident memory is read from /proc.
    #[cfg(target_os = "linux")]
    #[test]
    fn memory_a_burst_freed_goes_back_once_due_with_nothing_else_allocating() {
        if std::env::var_os(BURST_CHILD).is_none() {
            const NAME: &str = "memory::tests::memory_a_burst_freed_goes_back_once_due_with_nothing_else_allocating";
            let mut child = std::process::Command::new(std::env::current_exe().expect("the test binary"));
            child.args(["--exact", NAME, "--test-threads=1"]).env(BURST_CHILD, "1");
            for (_, variable, value) in super::ALLOCATOR_OPTIONS {
                child.env(variable, value.to_string());
            }
            let output = child.output().expect("the test binary runs");
            let stdout = String::from_utf8_lossy(&output.stdout);
            assert!(
                output.status.success() && stdout.contains("1 passed"),
                "{stdout}{}",
                String::from_utf8_lossy(&output.stderr)
            );
            return;
        }
        const BLOCKS: usize = 200_000;
        const BLOCK: usize = 64;
        let before = resident();
        // SAFETY: each block is mimalloc's own, freed once, never read.
        let peak = unsafe {
            let blocks: Vec<usize> = (0..BLOCKS).map(|_| libmimalloc_sys::mi_malloc(BLOCK) as usize).collect();
            assert!(blocks.iter().all(|block| *block != 0));
            let peak = resident();
            blocks.into_iter().for_each(|block| libmimalloc_sys::mi_free(block as *mut _));
            peak
        };
        assert!(peak >= before + BLOCKS * BLOCK, "the burst committed {} bytes", peak.saturating_sub(before));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            super::purge_due_memory();
            let now = resident();
            if now < before + BLOCKS * BLOCK / 4 {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "still {now} bytes resident, {before} before the burst");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// mimalloc is built without its "large pages" (.cargo/config.toml): a block between 64 and 512 KiB gets a
    /// page of its own, sized to it and given back when it is freed, instead of a place in a shared 4 MiB page
    /// that stays resident as far as any of its blocks ever reached while one of them lives (docs/decisions.md).
    /// In a shared page the block would be rounded up to its size class (229,376 bytes for this one).
    #[test]
    fn mimalloc_gives_a_mid_sized_block_a_page_of_its_own() {
        const SIZE: usize = 200_000;
        // SAFETY: a block allocated and freed here, never read; mi_usable_size takes a live mimalloc block.
        let usable = unsafe {
            let block = libmimalloc_sys::mi_malloc(SIZE);
            assert!(!block.is_null());
            let usable = libmimalloc_sys::mi_usable_size(block);
            libmimalloc_sys::mi_free(block);
            usable
        };
        assert!((SIZE..SIZE + 4096).contains(&usable), "{usable} usable bytes: mimalloc was built with its large pages (a CFLAGS without -DMI_ENABLE_LARGE_PAGES=0)");
    }
}
