"""Tabular inputs with named columns (``input.features``): a request may send a record
(``{"age": 41, ...}``, as pandas' ``to_json(orient="records")`` and Vertex AI's clients
send a row), several records, or a CSV whose header is matched by name. Each was a 400
("an object with keys [...]") or, for a CSV in another column order, a silently wrong row."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from hookwatch._config import HandlerConfig, InputSpec
from hookwatch._errors import ConfigError
from hookwatch._service import ModelService

NAMES = ["age", "income", "tenure", "score"]


def service() -> ModelService:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    handler = HandlerConfig.from_mapping(
        {"input": {"shape": [4], "features": NAMES}, "monitoring": {"layers": ["1"]}}
    )
    return ModelService(model.eval(), handler.input, None)


def row(i: int) -> list[float]:
    return [40.0 + i, 3.5 * i, 2.0, 0.25 * i]


def record(i: int, **extra: Any) -> dict[str, Any]:
    # In another order than the features', with a key the model does not read.
    values = dict(zip(NAMES, row(i), strict=True))
    return {"id": f"c-{i}", **dict(reversed(list(values.items()))), **extra}


def test_records_are_rows_in_the_features_order() -> None:
    served = service()
    alone = [served.handle([{"data": row(i)}])[0] for i in range(3)]
    out = served.handle(
        [
            record(0),
            {"data": record(1)},
            [record(1), record(2)],
            {"instances": [record(0), record(2)]},
            {"instances": [record(0)]},
        ]
    )
    assert out[0] == alone[0] and out[1] == alone[1]
    assert out[2] == [alone[1], alone[2]]
    assert out[3] == {"predictions": [alone[0], alone[2]]}
    assert out[4] == {"predictions": [alone[0]]}
    # Arrays are still taken as they were.
    assert served.handle([row(2)])[0] == alone[2]


def test_mlflows_table_forms_are_answered_as_it_answers() -> None:
    """MLflow's scoring clients send a table as ``dataframe_split`` (columns and rows) or
    ``dataframe_records``; answered ``{"predictions": [...]}``, as its server answers."""
    served = service()
    alone = [served.handle([{"data": row(i)}])[0] for i in range(2)]
    columns = list(reversed(NAMES))
    split = {"columns": columns, "data": [list(reversed(row(i))) for i in range(2)]}
    out = served.handle(
        [
            {"dataframe_split": split},
            {"dataframe_records": [record(0), record(1)]},
            {"dataframe_split": {"data": [row(1)]}},
        ]
    )
    assert out[0] == {"predictions": alone} and out[1] == {"predictions": alone}
    assert out[2] == {"predictions": [alone[1]]}
    plain = HandlerConfig.from_mapping({"input": {"shape": [4]}, "monitoring": {"layers": []}})
    positional = ModelService(served.model, plain.input, None)
    by_position, records = positional.handle(
        [{"dataframe_split": {"columns": NAMES, "data": [row(0)]}}, {"dataframe_records": [{}]}]
    )
    assert by_position == {"predictions": [alone[0]]}
    assert records["code"] == 400 and "input.features naming the columns" in records["expected"]


def test_a_record_without_a_feature_is_a_400_naming_it() -> None:
    served = service()
    partial = record(0)
    del partial["tenure"]
    out = served.handle([partial, [record(0), {"age": 1}], {"nothing": 1}])
    assert out[0]["expected"] == "a value for each of the 4 features (input.features)"
    assert out[0]["got"] == "none for 'tenure' in the record"
    assert out[1]["got"] == "none for 'income', 'tenure', 'score' in record 1"
    assert all(answer["code"] == 400 for answer in out)
    bad = served.handle([{**record(0), "age": "old"}])[0]
    assert bad["code"] == 400 and "str 'old'" in bad["got"], bad


def test_a_csv_header_is_matched_by_name() -> None:
    served = service()
    alone = [served.handle([{"data": row(i)}])[0] for i in range(2)]
    # Columns in another order, and one the model does not read.
    header = "id,score,tenure,income,age"
    lines = [f"c-{i},{row(i)[3]},{row(i)[2]},{row(i)[1]},{row(i)[0]}" for i in range(2)]
    out = served.handle(["\n".join([header, *lines]), "age,income\n1,2", f"{header}\n1,2"])
    # The id column ("c-0", no number) is not read.
    assert out[0] == alone
    assert out[1]["got"] == "none for 'tenure', 'score'", out[1]
    assert out[2]["got"] == "2 in line 2", out[2]


@pytest.mark.parametrize(
    "features",
    [["a", "b"], ["a", "a", "b", "c"], "abcd", ["a", "b", "c", ""]],
)
def test_features_name_each_value_of_a_tabular_input(features: Any) -> None:
    with pytest.raises(ConfigError, match=r"input\.features: expected a distinct name per value"):
        InputSpec.from_mapping({"shape": [4], "features": features})
    with pytest.raises(ConfigError, match=r"input\.features"):
        InputSpec.from_mapping({"shape": [2, 2], "features": ["a", "b", "c", "d"]})


def test_archived_from_a_csv_read_by_its_header(tmp_path: Path) -> None:
    """A tabular model's held-out rows as its users keep them, a CSV with a header (columns
    in any order, an id, the label): read by name where the input names its features, the
    ``label`` column the accuracy estimate's labels. Without ``input.features`` a table is
    still refused, saying how to read it."""
    import numpy as np
    import yaml

    from hookwatch.tools.own_model import ModelRef, archive_model
    from tests.fakes import archived_handler, handled

    (tmp_path / "tab.py").write_text(
        "import torch\nfrom torch import nn\n\n"
        "class Tab(nn.Sequential):\n"
        "    def __init__(self):\n"
        "        torch.manual_seed(0)\n"
        "        super().__init__(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))\n"
    )
    config = tmp_path / "model-config.yaml"
    handler = {
        "input": {"shape": [4], "features": NAMES},
        "monitoring": {"layers": ["1"], "output": {"head": "logits"}},
    }
    config.write_text(yaml.safe_dump({"handler": handler}))
    rng = np.random.default_rng(0)
    lines = ["id,score,label,tenure,income,age"]
    for i in range(120):
        age, income, tenure, score = rng.normal(size=4).round(4)
        lines.append(f"c-{i},{score},{i % 3},{tenure},{income},{age}")
    table = tmp_path / "held_out.csv"
    table.write_text("\n".join(lines) + "\n")
    said: list[str] = []
    mar = archive_model(
        ModelRef.parse(f"{tmp_path / 'tab.py'}:Tab"),
        "tab",
        config,
        table,
        tmp_path / "store",
        tmp_path / "build",
        say=said.append,
    )
    assert any("drift profile from 120 reference samples" in s for s in said), said
    assert any("accuracy estimate from the 'label' column of held_out.csv" in s for s in said)
    with archived_handler(mar, tmp_path / "served") as (served, context):
        out = handled(served, [{"body": record(1)}, {"body": {"data": row(1)}}], context)
    assert out[0] == out[1] and "class" in out[0]
    plain = tmp_path / "plain.yaml"
    plain.write_text(yaml.safe_dump({"handler": {**handler, "input": {"shape": [4]}}}))
    with pytest.raises(ConfigError, match=r"name its columns in input\.features"):
        archive_model(
            ModelRef.parse(f"{tmp_path / 'tab.py'}:Tab"),
            "tab",
            plain,
            table,
            tmp_path / "store",
            tmp_path / "build2",
            say=lambda _: None,
        )


def test_generated_records_and_tables_get_an_answer_or_a_clear_4xx() -> None:
    """Records with keys and values drawn at random, MLflow's tables, CSV with headers:
    answered, or refused with a 4xx whose reason hookwatch names."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from hookwatch._metrics import MetricSet
    from tests.payloads import _json_values, _numbers, _structured

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3)).eval()
    handler = HandlerConfig.from_mapping(
        {"input": {"shape": [4], "features": NAMES}, "monitoring": {"layers": []}}
    )
    served = ModelService.from_handler_config(model, handler, "records", MetricSet())
    keys = st.sampled_from([*NAMES, "id", ""])
    records = st.dictionaries(keys, st.one_of(_numbers, _json_values), max_size=6)
    csv = st.lists(st.sampled_from([*NAMES, "id", "1", "x", ""]), max_size=6).flatmap(
        lambda header: st.lists(
            st.lists(st.sampled_from(["1", "-2.5", "x", "", "1e400"]), max_size=7), max_size=3
        ).map(lambda rows: "\n".join(",".join(r) for r in [header, *rows]))
    )
    bodies = st.one_of(
        records,
        st.lists(records, max_size=3),
        st.fixed_dictionaries({"dataframe_records": st.lists(records, max_size=3)}),
        st.fixed_dictionaries({"instances": st.lists(records, max_size=3)}),
        _structured(),
        csv,
    )

    @settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
    @given(body=bodies)
    def check(body: Any) -> None:
        answer = served.handle([body])[0]
        ok = isinstance(answer, list) or "class" in answer or "predictions" in answer
        if not ok and "outputs" not in answer:
            assert answer["code"] in (400, 413) and answer["expected"] and answer["got"], answer

    check()
    assert served.monitor is not None
    assert "unreadable" not in served.monitor._counts().rejected_by
    served.close()
