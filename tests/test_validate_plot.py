"""validate --plot: the priced rows drawn to a PNG, refused where there is no pass to draw."""
from click.testing import CliRunner

from piper_plan.cli import main


def test_validate_draws_its_rows_to_a_png_and_refuses_a_plot_it_cannot_draw(tmp_path):
    png = tmp_path / "v.png"
    out = CliRunner().invoke(main, ["validate", "--group", "xmoe2025", "--plot", str(png)])
    assert out.exit_code == 0, out.output
    assert f"wrote {png}" in out.output and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with_explain = CliRunner().invoke(main, ["validate", "--explain", "xmoe-f13-small", "--plot", str(png)])
    assert with_explain.exit_code != 0 and "--plot" in with_explain.output
    nowhere = CliRunner().invoke(main, ["validate", "--group", "xmoe2025", "--plot", str(tmp_path / "no" / "v.png")])
    assert nowhere.exit_code != 0 and "--plot" in nowhere.output and "Traceback" not in nowhere.output


def test_validate_answers_one_question_a_call_instead_of_ignoring_the_second():
    for args in (["--sensitivity", "--batch-scan"], ["--residuals", "--explain", "xmoe-f13-small"]):
        out = CliRunner().invoke(main, ["validate", *args])
        assert out.exit_code == 2 and "one of them a call" in out.output, args
