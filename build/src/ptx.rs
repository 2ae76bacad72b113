//! Reads the parameter lists of the `.entry` directives of PTX that nvcc wrote: what the
//! compiled kernel really takes, to check the parsed signatures against.

use std::collections::BTreeMap;

/// Each entry's name and the size in bytes of each of its parameters, in order.
pub(crate) fn entries(ptx: &str) -> Result<BTreeMap<String, Vec<usize>>, String> {
    let mut out = BTreeMap::new();
    let mut rest = ptx;
    while let Some(at) = find_directive(rest, ".entry") {
        let after = &rest[at + ".entry".len()..];
        let open = after
            .find('(')
            .ok_or_else(|| "an `.entry` without a parameter list".to_string())?;
        let name = after[..open].trim().to_string();
        let close = after[open..]
            .find(')')
            .map(|c| open + c)
            .ok_or_else(|| format!("the parameter list of `.entry {name}` does not close"))?;
        let list = &after[open + 1..close];
        let mut sizes = Vec::new();
        for param in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            sizes
                .push(param_size(param).ok_or_else(|| {
                    format!("cannot read parameter `{param}` of `.entry {name}`")
                })?);
        }
        out.insert(name, sizes);
        rest = &after[close..];
    }
    Ok(out)
}

/// `.entry` as a word (not `.entry_x`).
fn find_directive(text: &str, word: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(i) = text[from..].find(word) {
        let at = from + i;
        let next = text[at + word.len()..].chars().next();
        if next.is_some_and(char::is_whitespace) {
            return Some(at);
        }
        from = at + word.len();
    }
    None
}

/// `.param .u64 .ptr .global .align 4 k_param_0`, `.param .align 8 .b8 k_param_1[64]`.
fn param_size(param: &str) -> Option<usize> {
    let mut words = param.split_whitespace();
    if words.next()? != ".param" {
        return None;
    }
    let mut elem = None;
    let mut name = None;
    let mut skip_number = false;
    for w in words {
        if skip_number {
            skip_number = false;
            continue;
        }
        match w {
            ".align" => skip_number = true,
            ".ptr" | ".global" | ".const" | ".shared" | ".local" => {}
            _ if w.starts_with('.') => elem = Some(type_size(w)?),
            _ => name = Some(w),
        }
    }
    let (elem, name) = (elem?, name?);
    let count = match name.split_once('[') {
        Some((_, n)) => n.strip_suffix(']')?.parse::<usize>().ok()?,
        None => 1,
    };
    Some(elem * count)
}

fn type_size(t: &str) -> Option<usize> {
    let bits: usize = t
        .strip_prefix(".u")
        .or_else(|| t.strip_prefix(".s"))
        .or_else(|| t.strip_prefix(".b"))
        .or_else(|| t.strip_prefix(".f"))?
        .parse()
        .ok()?;
    matches!(bits, 8 | 16 | 32 | 64).then_some(bits / 8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_scalars_pointers_structs_and_empty_lists() {
        let ptx = "
.version 9.0
.target sm_90
.address_size 64

	// .globl	axpby
.visible .entry axpby(
	.param .u64 axpby_param_0,
	.param .u64 .ptr .global .align 4 axpby_param_1,
	.param .u32 axpby_param_2,
	.param .f32 axpby_param_3,
	.param .f64 axpby_param_4
)
{
	ld.param.u64 	%rd1, [axpby_param_0];
}
.visible .entry ddqn_target(
	.param .u64 ddqn_target_param_0,
	.param .align 8 .b8 ddqn_target_param_1[64],
	.param .align 2 .b8 ddqn_target_param_2[2],
	.param .u8 ddqn_target_param_3,
	.param .s16 ddqn_target_param_4
)
.maxntid 256, 1, 1
{
}
.weak .entry _Z6mangledPf(
	.param .u64 _Z6mangledPf_param_0
)
{
}
.visible .entry none()
{
}
";
        let e = entries(ptx).unwrap();
        assert_eq!(e["axpby"], [8, 8, 4, 4, 8]);
        assert_eq!(e["ddqn_target"], [8, 64, 2, 1, 2]);
        assert_eq!(e["_Z6mangledPf"], [8]);
        assert_eq!(e["none"], Vec::<usize>::new());
        assert_eq!(e.len(), 4);
    }

    #[test]
    fn an_unreadable_parameter_is_an_error_naming_it() {
        let e = entries(".visible .entry k(\n\t.param .weird k_param_0\n)\n{\n}\n").unwrap_err();
        assert_eq!(
            e,
            "cannot read parameter `.param .weird k_param_0` of `.entry k`"
        );
        let e = entries(".visible .entry k(\n\t.param .u32 k_param_0\n").unwrap_err();
        assert_eq!(e, "the parameter list of `.entry k` does not close");
    }
}
