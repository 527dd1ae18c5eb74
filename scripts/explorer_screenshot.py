"""Picture an explorer page in headless Chromium, a query pinned and a head chosen, as the README's.

    python scripts/explorer_screenshot.py PAGE.html OUT.png --query 54 --layer 1 --head 1

Needs playwright (the dev extra) and a Chromium: Debian's `chromium` package, found on the
PATH, or `--chromium PATH`. The PNG is reduced to a 256-colour palette, which keeps it small.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("page", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--query", type=int, help="token to pin as the query (default: the page's)")
    p.add_argument("--layer", default="0")
    p.add_argument("--head", default="0")
    p.add_argument("--width", type=int, default=1150)
    p.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser"),
                   help="browser executable (default: chromium on the PATH, else Playwright's own)")
    args = p.parse_args(argv)
    if not args.page.is_file():
        print(f"error: {args.page}: no such page", file=sys.stderr)
        return 2
    mistake = check_choices(args)  # before the browser, which would wait 30 s for a missing option
    if mistake:
        print(f"error: {mistake}", file=sys.stderr)
        return 2

    from PIL import Image
    try:
        from playwright.sync_api import Error as PlaywrightError
        from playwright.sync_api import sync_playwright
    except ImportError:
        print("error: the screenshot needs playwright: pip install -e '.[dev]'", file=sys.stderr)
        return 2

    with sync_playwright() as playwright:
        try:
            browser = playwright.chromium.launch(executable_path=args.chromium)
        except PlaywrightError as e:
            print(f"error: cannot start Chromium (apt-get install chromium, or --chromium PATH): "
                  f"{str(e).splitlines()[0]}", file=sys.stderr)
            return 2
        page = browser.new_page(viewport={"width": args.width, "height": 900})
        page.goto(args.page.resolve().as_uri())
        page.select_option("#layer", args.layer)
        if args.layer != "mean":
            page.select_option("#head", args.head)
        if args.query is not None:
            page.click(f"#weights-row .tok[data-pos='{args.query}']")  # pins it
        page.mouse.move(0, 0)
        page.screenshot(path=str(args.out), full_page=True)
        browser.close()
    Image.open(args.out).convert("RGB").quantize(256).save(args.out, optimize=True)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1024:,.0f} KiB)")
    return 0


def check_choices(args: argparse.Namespace) -> str | None:
    """What is wrong with the page or --layer, --head, --query for it, in one line (None: nothing).
    The page's own data says its layers, heads and tokens: the choices its selectors and tokens offer."""
    from tinyattn.analysis.explorer import data_of_page
    from tinyattn.errors import TinyattnError

    try:
        data = data_of_page(args.page.read_text(encoding="utf-8", errors="replace"))
    except (TinyattnError, ValueError) as e:
        return f"{args.page}: {e}; give a page written by tinyattn attention --html"
    tokens = len(data["tokens"])
    for flag, value, count, what in (("--layer", args.layer, data["layers"], "layers"),
                                     ("--head", args.head, data["heads"], "heads")):
        if value not in [str(i) for i in range(count)] + ["mean"]:
            return f"{flag} {value}: the page has {count} {what}; expected 0..{count - 1} or mean"
    if args.query is not None and not 0 <= args.query < tokens:
        return f"--query {args.query}: the page has {tokens} tokens; expected 0..{tokens - 1}"
    return None


if __name__ == "__main__":
    raise SystemExit(main())
