//! Compile-time guards: every schedule mistake is a compile error pointing at the token
//! (tests/ui/<kind>/<mistake>.rs with its exact .stderr), and the pass cases compile.
//! Regenerate the .stderr files with `TRYBUILD=overwrite cargo test --test ui` and
//! review them like code.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*/*.rs");
    t.pass("tests/pass/*.rs");
}
