import copy
import html
import re

from structlens.report.html import SECTIONS, render_html

EVIL = '<img src=x onerror="alert(1)">'
CLOSE = "</script><script>alert(2)</script>"


def _poisoned(doc):
    doc = copy.deepcopy(doc)
    doc["run"]["model"] = EVIL
    doc["tasks"]["caveats"].append({"kind": "x", "message": CLOSE})
    entry = doc["ndm"]["details"]["browser"]["entries"][0]
    entry["context"] = [EVIL, CLOSE, "&amp;"]
    entry["prompt"] = EVIL
    return doc


def test_text_from_the_data_is_escaped(analysis):
    page = render_html(_poisoned(analysis))
    assert EVIL not in page and CLOSE not in page
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in page
    # exactly two script elements: the embedded JSON and the page's own script
    assert page.count("<script") == 2
    assert page.count("</script>") == 2


def test_page_is_self_contained(analysis):
    page = render_html(analysis)
    refs = re.findall(r"""(?:src|href)\s*=\s*["']?([^"' >]+)""", page)
    assert refs, "the page has links (navigation) to check"
    assert all(not r.lower().startswith(("http:", "https:", "//")) for r in refs)
    assert not re.search(r"url\(\s*['\"]?https?:", page)
    assert "@import" not in page


def test_every_section_and_number_with_ci_is_rendered(analysis):
    page = render_html(analysis)
    for method in SECTIONS:
        assert f'<section id="{method}">' in page
    # every headline CI appears formatted next to its value
    for method in SECTIONS:
        for h in analysis[method]["headline"].values():
            if h["ci"] is not None and h["value"] is not None:
                assert f"{h['ci'][0]:.3f}" in page or f"{h['ci'][0]:.3g}" in page
    for method in SECTIONS:
        for c in analysis[method]["caveats"]:
            assert html.escape(c["message"], quote=True) in page


def test_each_section_shows_the_measured_calibration_of_its_rules(analysis):
    from structlens.verdicts import calibration_notes

    page = render_html(analysis)
    assert calibration_notes("koopman") and calibration_notes("equivalence")
    for method in SECTIONS:
        section = page[page.index(f'<section id="{method}">') :]
        section = section[: section.index("</section>")]
        for note in calibration_notes(method):
            assert html.escape(note, quote=True) in section


def test_render_is_deterministic(analysis):
    assert render_html(analysis) == render_html(copy.deepcopy(analysis))
