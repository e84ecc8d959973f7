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

#[cfg(test)]
mod tests {
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
