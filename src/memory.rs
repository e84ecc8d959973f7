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
