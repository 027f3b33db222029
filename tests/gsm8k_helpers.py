"""A tiny dataset in GSM8K's format and hub layout, for the tests that load it like openai/gsm8k.

The hub repository holds `main/train-*.parquet` and `main/test-*.parquet`, declared as the
`main` configuration in its README's YAML header; `datasets.load_dataset(folder, "main",
split=...)` reads this folder exactly as it reads the hub id.
"""

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

README = """---
configs:
- config_name: main
  data_files:
  - split: train
    path: main/train-*
  - split: test
    path: main/test-*
---
"""

ROWS = [
    {"question": "Tom has 3 boxes with 4 apples in each box. How many apples does Tom have?",
     "answer": "Tom has 3 * 4 = <<3*4=12>>12 apples.\n#### 12"},
    {"question": "A pen costs $2 and a notebook costs $5. How much do 2 pens and 1 notebook cost?",
     "answer": "2 pens cost 2 * 2 = <<2*2=4>>4 dollars.\nIn all they cost 4 + 5 = <<4+5=9>>9 dollars.\n#### 9"},
    {"question": "Sara read 15 pages on Monday and twice as many on Tuesday. How many pages did she read?",
     "answer": "On Tuesday she read 15 * 2 = <<15*2=30>>30 pages.\nShe read 15 + 30 = <<15+30=45>>45 pages.\n#### 45"},
    {"question": "There are 20 birds on a tree. 7 fly away and 3 come back. How many birds are on the tree?",
     "answer": "After 7 fly away there are 20 - 7 = <<20-7=13>>13.\nThen 13 + 3 = <<13+3=16>>16.\n#### 16"},
    {"question": "A class of 24 students splits into teams of 6. How many teams are there?",
     "answer": "There are 24 / 6 = <<24/6=4>>4 teams.\n#### 4"},
    {"question": "Mia saves $5 a week for 8 weeks, then spends $12. How much money does she have left?",
     "answer": "She saves 5 * 8 = <<5*8=40>>40 dollars.\nShe has 40 - 12 = <<40-12=28>>28 dollars left.\n#### 28"},
    {"question": "A train travels 60 miles per hour for 3 hours. How far does it go?",
     "answer": "It goes 60 * 3 = <<60*3=180>>180 miles.\n#### 180"},
    {"question": "Ben has 9 marbles and finds 6 more. He gives 5 to his sister. How many does he keep?",
     "answer": "He has 9 + 6 = <<9+6=15>>15 marbles.\nHe keeps 15 - 5 = <<15-5=10>>10.\n#### 10"},
]


def write_gsm8k(folder: Path, train: int = 6, test: int = 2) -> Path:
    """The first `train` rows as the train split and the next `test` as the test split; returns `folder`."""
    (folder / "main").mkdir(parents=True, exist_ok=True)
    (folder / "README.md").write_text(README)
    pq.write_table(pa.Table.from_pylist(ROWS[:train]), folder / "main" / "train-00000-of-00001.parquet")
    pq.write_table(pa.Table.from_pylist(ROWS[train : train + test]), folder / "main" / "test-00000-of-00001.parquet")
    return folder
