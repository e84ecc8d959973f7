//! sqlx's `migrate!` embeds the files of migrations/ when src/store compiles, but cargo does not know a new file
//! there should rebuild it: this tells cargo (as sqlx's documentation recommends).
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
