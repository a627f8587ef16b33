#!/usr/bin/env python3
"""Writes the tokenizer parity corpus: one string per line, base64 of its bytes (so newlines, NULs and
invalid UTF-8 survive). Deterministic: the same seed gives the same file.

Families: English prose with contractions, code, numbers, whitespace runs (tabs, CR/LF, Unicode
spaces), CJK, emoji (ZWJ, flags, skin tones), combining marks (decomposed, misordered, Hangul jamo),
other scripts, special-token strings inside text, invalid UTF-8, mixtures and a few long strings.
usage: python3 tools/tok_corpus.py [--seed N] [--count N] > corpus.b64
"""
import argparse
import base64
import random

WORDS = ("the of and to in is you that it he was for on are as with his they I at be this have "
         "from or one had by word but not what all were we when your can said there use an each "
         "which she do how their if will up other about out many then them these so some her "
         "would make like him into time has look two more write go see number no way could people "
         "my than first water been call who oil its now find long down day did get come made may "
         "part Once upon time little girl named Lily she loved play outside sunshine Hello World "
         "don't can't won't it's I'm you're we've they'll he'd She'S WE'LL YOU'RE I'VE").split()
CODE = [
    "def f(x):\n    return x * 2\n",
    "for (int i = 0; i < n; i++) {\n\tsum += a[i];\n}\n",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); }",
    "const x = await fetch(`/api/${id}`).then(r => r.json());",
    "if x != None and y >= 3:\n        print('ok')  # comment\n",
    "SELECT * FROM users WHERE id = 7 AND name LIKE '%bob%';",
    "<div class=\"a\">&nbsp;</div>\n<!-- c -->",
    "x += 1; y -= 2; z **= 3; w //= 4; v <<= 1; u >>>= 2;",
    "fn main() -> Result<(), Box<dyn Error>> { Ok(()) }",
    "   \t\tindented line\n\n\n    more    spaces   here   ",
    "{\"key\": [1, 2.5, -3e10, true, null], \"k2\": {\"a\": \"b\"}}",
    "$ ls -la /usr/bin | grep -E '^d' && echo done 2>&1",
]
CJK = ["你好，世界！", "我们今天去公园玩吧。", "日本語のテキストです。", "カタカナとひらがな",
       "한국어 문장입니다.", "東京都渋谷区", "漢字漢字漢字漢字", "中文English混合text", "ｆｕｌｌｗｉｄｔｈ　ｓｐａｃｅ"]
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷🇯🇵", "❤️", "🤖🚀✨", "🏳️‍🌈", "🙂🙃", "👩🏿‍💻", "1️⃣", "🧑‍🤝‍🧑"]
COMBINING = ["e\u0301", "a\u0308", "o\u0302\u0323", "o\u0323\u0302", "A\u030a", "n\u0303",
             "\u1100\u1161\u11a8", "\u1112\u1161\u11ab", "Cafe\u0301", "re\u0301sume\u0301",
             "Tie\u0323\u0302ng Vie\u0323\u0302t", "\u0915\u093c", "q\u0307\u0323", "\u212b", "\u2126",
             "a\u0301\u0301\u0301", "\u0301start", "x\u0327\u0301", "\u00e9\u0301", "s\u0323\u0307",
             "\u0041\u030a\u0301", "\u1e9b\u0323", "fi\ufb01", "\u0f73", "\u0344", "\u0958"]
SCRIPTS = ["Привет, мир!", "Γειά σου Κόσμε", "مرحبا بالعالم", "שלום עולם", "สวัสดีชาวโลก",
           "नमस्ते दुनिया", "Ελληνικά ΑΒΓ", "Ünïcödé Ärger ß ẞ", "İstanbul ıi", "ǅemal ǈ ǋ"]
SPECIALS = ["<s>", "</s>", "<unk>", "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>",
            "<|start_header_id|>", "<|end_header_id|>", "<|im_start|>", "<|im_end|>", "<|endoftext|>",
            "<think>", "</think>", "<tool_call>", "<|fim_prefix|>", "<|reserved_special_token_5|>",
            "<|im_start", "<s", "<<s>>", "<|eot_id|><|eot_id|>"]
SPACES = [" ", "  ", "   ", "\t", "\n", "\r\n", "\n\n", "\u00a0", "\u3000", "\u2009", "\u0085", "\ufeff",
          "\u200b", "\u2028", " \t ", "\x0b", "\x0c", "\r"]
PUNCT = list(".,;:!?-()[]{}\"'`~@#$%^&*_+=|\\/<>") + ["...", "--", "!!", "?!", "'s", "’s", "«»"]


def english(r):
    n = r.randint(1, 25)
    out = []
    for i in range(n):
        w = r.choice(WORDS)
        if r.random() < 0.1:
            w = w.upper()
        elif r.random() < 0.15:
            w = w.capitalize()
        out.append(w)
        if r.random() < 0.15:
            out[-1] += r.choice(PUNCT)
    s = " ".join(out)
    if r.random() < 0.5:
        s += r.choice([".", "!", "?", "", "\n"])
    return s


def number(r):
    k = r.randint(0, 6)
    if k == 0:
        return str(r.randint(0, 10 ** r.randint(1, 20)))
    if k == 1:
        return "%.*f" % (r.randint(1, 6), r.uniform(-1e6, 1e6))
    if k == 2:
        return "{:,}".format(r.randint(0, 10 ** 12))
    if k == 3:
        return "+1 (%03d) %03d-%04d" % (r.randint(0, 999), r.randint(0, 999), r.randint(0, 9999))
    if k == 4:
        return " ".join(str(r.randint(0, 99999)) for _ in range(r.randint(2, 8)))
    if k == 5:
        return "v%d.%d.%d-rc%d" % tuple(r.randint(0, 20) for _ in range(4))
    return "".join(r.choice("0123456789٣४७") for _ in range(r.randint(1, 30)))


def whitespace(r):
    parts = []
    for _ in range(r.randint(1, 8)):
        parts.append(r.choice(SPACES) * r.randint(1, 5))
        if r.random() < 0.6:
            parts.append(r.choice(WORDS))
    return "".join(parts)


def invalid(r):
    k = r.randint(0, 7)
    pre = english(r) if r.random() < 0.5 else ""
    bad = [b"\xff", b"\xc3", b"\xe2\x82", b"\xf0\x9f\x98", b"\x80\x80", b"\xc0\xaf", b"\xed\xa0\x80",
           b"\xf5\x80\x80\x80", b"\xe0\x80\x80", b"\xfe\xfe", b"\xf4\x90\x80\x80"][k % 11:k % 11 + 2]
    mid = b"".join(bad)
    if k == 7:
        mid = bytes(r.randint(0, 255) for _ in range(r.randint(1, 20)))
    post = english(r) if r.random() < 0.5 else ""
    return pre.encode() + mid + post.encode()


def special(r):
    parts = []
    for _ in range(r.randint(1, 5)):
        parts.append(r.choice([english(r), r.choice(SPECIALS), r.choice(SPACES), r.choice(SPECIALS)]))
    return "".join(parts)


def mixture(r):
    gens = [english, number, whitespace, lambda r: r.choice(CJK), lambda r: r.choice(EMOJI),
            lambda r: r.choice(COMBINING), lambda r: r.choice(SCRIPTS), lambda r: r.choice(CODE),
            lambda r: r.choice(PUNCT)]
    return "".join(r.choice(gens)(r) + r.choice(["", " ", "", "\n"]) for _ in range(r.randint(2, 8)))


def combining(r):
    return "".join(r.choice(COMBINING) + r.choice(["", " ", r.choice(WORDS)]) for _ in range(r.randint(1, 6)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=20261122)
    ap.add_argument("--count", type=int, default=2400)
    a = ap.parse_args()
    r = random.Random(a.seed)
    fixed = ["", " ", "a", "\n", "Once upon a time", "Hello world", "  leading", "trailing  ", "ſ's 'S 'ſ",
             "\u212a", "\ufeffBOM", "\u2581x \u2581 y", "\x00nul\x00", "tab\there", "a\r\nb\rc\nd"]
    fixed += CODE + CJK + EMOJI + COMBINING + SCRIPTS + SPECIALS
    fixed += ["".join(r.choice(WORDS) + " " for _ in range(800)), "a" * 3000, " " * 500 + "x",
              "\n" * 300, "9" * 500, "😀" * 200, "的" * 400]
    fams = [english] * 5 + [number] * 2 + [whitespace] * 2 + [combining] * 2 + [special] * 2 + \
           [mixture] * 4 + [lambda r: r.choice(CODE) * r.randint(1, 3), lambda r: r.choice(CJK) + r.choice(CJK),
                            lambda r: "".join(r.choice(EMOJI) for _ in range(r.randint(1, 6)))]
    out = [s.encode() for s in fixed]
    while len(out) < a.count:
        if r.random() < 0.06:
            out.append(invalid(r))
        else:
            out.append(r.choice(fams)(r).encode("utf-8", "surrogatepass"))
    for b in out:
        print(base64.b64encode(b).decode())


if __name__ == "__main__":
    main()
