//! Giving memory back: the C allocator keeps what the process freed in its arenas unless asked to return it,
//! so a satellite that let go of a large structure (the token encoder) would otherwise keep its peak RSS.

/// Return the allocator's free memory to the operating system (glibc's `malloc_trim`; elsewhere nothing).
pub fn return_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists; it takes no pointers from us.
    unsafe {
        nix::libc::malloc_trim(0);
    }
}
