#!/usr/bin/env python3
"""Prints the wgmma inline-asm wrappers that wgmma_tf32.cu contains between the
GENERATED-BEGIN / GENERATED-END markers (run: python3 gen_wrappers.py > /tmp/w.inc and
paste, or `python3 gen_wrappers.py --check wgmma_tf32.cu` to verify the pasted copy).

One wrapper per (form, N): SS = A and B from shared memory (two descriptors), RS = A from
four registers. Operand numbering: %0 .. %(N/2 - 1) are the accumulators ("+f"), then
the A descriptor or the four A registers, the B descriptor, then scale_d (a register
turned into the predicate p: p false means D = A*B, the old accumulator is ignored).
imm-scale-a = imm-scale-b = 1 (no negation). TF32 has no imm-trans operands (PTX ISA,
wgmma.mma_async syntax for .tf32)."""
import sys


def wrapper(form, n):
    nacc = n // 2
    acc_list = ", ".join(f"%{i}" for i in range(nacc))
    lines = []
    if form == "ss":
        a_ops = f"%{nacc}"
        b_op = f"%{nacc + 1}"
        sc = nacc + 2
        sig = (f"__device__ __forceinline__ void wgmma_ss_n{n}(float (&d)[{nacc}], "
               f"uint64_t desc_a, uint64_t desc_b, int scale_d)")
        ins = '"l"(desc_a), "l"(desc_b), "r"(scale_d)'
    else:
        a_ops = "{" + ", ".join(f"%{nacc + j}" for j in range(4)) + "}"
        b_op = f"%{nacc + 4}"
        sc = nacc + 5
        sig = (f"__device__ __forceinline__ void wgmma_rs_n{n}(float (&d)[{nacc}], "
               f"const uint32_t (&a)[4], uint64_t desc_b, int scale_d)")
        ins = '"r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d)'
    lines.append(sig + " {")
    lines.append("    asm volatile(")
    lines.append('        "{\\n.reg .pred p;\\n"')
    lines.append(f'        "setp.ne.b32 p, %{sc}, 0;\\n"')
    lines.append(f'        "wgmma.mma_async.sync.aligned.m64n{n}k8.f32.tf32.tf32 "')
    # split the accumulator list over several string literals
    accs = [f"%{i}" for i in range(nacc)]
    chunks = [", ".join(accs[i:i + 16]) for i in range(0, nacc, 16)]
    lines.append('        "{"')
    for ci, c in enumerate(chunks):
        sep = ", " if ci + 1 < len(chunks) else ""
        lines.append(f'        "{c}{sep}"')
    lines.append(f'        "}}, {a_ops}, {b_op}, p, 1, 1;\\n}}\\n"')
    outs = [f'"+f"(d[{i}])' for i in range(nacc)]
    out_lines = [", ".join(outs[i:i + 8]) for i in range(0, nacc, 8)]
    lines.append("        : " + (",\n          ".join(out_lines)))
    lines.append("        : " + ins + ");")
    lines.append("}")
    return "\n".join(lines)


def generate():
    out = []
    for n in (64, 128, 256):
        out.append(wrapper("ss", n))
    for n in (64, 128, 256):
        out.append(wrapper("rs", n))
    return "\n\n".join(out) + "\n"


if __name__ == "__main__":
    text = generate()
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        src = open(sys.argv[2]).read()
        b = src.index("// GENERATED-BEGIN\n") + len("// GENERATED-BEGIN\n")
        e = src.index("// GENERATED-END")
        if src[b:e] != text:
            print("generated wrappers differ from gen_wrappers.py output")
            sys.exit(1)
        print("generated wrappers match")
    else:
        sys.stdout.write(text)
