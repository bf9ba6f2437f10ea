"""Japanese (issue 34): a logistics company's depot staff in their work chat, polite but brief
(です/ます, 了解です). Buildings are warehouses by town and number ("厚木第2倉庫"); the routine
jobs and breakdowns are a depot's (forklift checks, stocktaking, a roller shutter that will not
go up); work orders "WO-3920", amounts in yen with a comma ("48,300円"), dates on a 24-hour
clock ("4月18日14時半"). Words are written in kanji, katakana and hiragana with no spaces; the
paraphrase rule's units are the character bigrams of each run of kanji or katakana (the content
words: hiragana mostly carries particles and endings)."""

from __future__ import annotations

import random
import re

from benchmark.languages import Forms, Language, firms, term_table

PEOPLE = ("田中さん", "鈴木さん", "佐藤課長", "高橋さん", "伊藤主任", "渡辺さん",
          "山本さん", "中村所長", "小林さん", "加藤さん", "吉田さん", "山田さん")  # fmt: skip
TOWNS = (
    "厚木", "川崎", "相模原", "八王子", "所沢", "川口", "柏", "船橋", "浦安", "市川", "松戸",
    "草加", "越谷", "春日部", "上尾", "熊谷", "平塚", "藤沢", "小田原", "町田", "府中", "立川",
    "青梅", "入間", "狭山", "鴻巣", "野田", "成田", "佐倉", "海老名", "戸田", "蕨", "朝霞",
    "座間", "綾瀬", "志木",
)  # fmt: skip
FIRM_NAMES = (
    "丸山", "大和", "東和", "日栄", "三協", "北斗", "富士見", "光洋", "新星", "朝日", "栄進",
    "協和", "太陽", "明光", "昭和", "大成", "共栄", "永和", "恒和", "双葉", "若葉", "千代田",
    "松竹", "青葉", "緑川", "白鳥", "黒田", "金井", "銀河", "旭",
)  # fmt: skip
FIRM_KINDS = ("運輸", "サービス", "設備", "工業", "技研")
MONTHS = tuple(f"{m}月" for m in range(1, 13))
DAYS = ("月曜", "火曜", "水曜", "木曜", "金曜", "土曜")


def places(rng: random.Random, count: int) -> list[Forms]:
    depots = [f"{town}第{n}倉庫" for town in TOWNS for n in range(1, 5)]
    if count > len(depots):
        raise ValueError(f"too many conversations: {count} depots needed, {len(depots)} named")
    return [{"name": name} for name in rng.sample(depots, count)]


contractors = firms(FIRM_NAMES, FIRM_KINDS)


def date(month: int, day: int, hour: int, minute: int) -> str:
    return f"{month}月{day}日{hour}時{'半' if minute else ''}"


TASKS = term_table("""
フォークリフト点検 | 荷役車両の定期チェック | 荷役車両チェック
棚卸し | 在庫数の実地カウント | 在庫カウント
害虫駆除 | 虫よけ薬剤の散布 | 薬剤散布
消防設備点検 | 火災報知器と消火器の確認 | 報知器の確認
床清掃 | 床面のモップがけ | モップがけ
空調保守 | エアコンの調子見 | エアコン整備
防犯カメラ保守 | 監視用レンズの手入れ | 監視レンズ手入れ
廃棄物回収 | ゴミの引き取り | ゴミ引き取り
照明交換 | 天井ライトの付け替え | 天井ライト付け替え
パレット補修 | 木製の荷台の直し | 荷台の直し
トラック洗車 | 配送車両の外装洗い | 配送車両洗い
""")  # fmt: skip
DEFECTS = term_table("""
シャッター故障 | 搬入口の扉が上がらない | 搬入口の扉
雨漏り | 天井から水がぽたぽた落ちる | 天井から水
冷凍庫の温度異常 | 冷やす部屋が設定より暖かい | 冷やす部屋が暖かい
ドック破損 | 荷受け場の段差プレートが割れた | 段差プレート割れ
コンベア停止 | 仕分けベルトが止まった | 仕分けベルト停止
トイレ詰まり | 便所の水が流れない | 便所の水
自動ドア不具合 | 入口のセンサー扉が開かない | センサー扉
回線障害 | インターネットがつながらない | インターネット不通
""")  # fmt: skip
CONTENT_RUN = re.compile(r"[\u30a0-\u30ff\u4e00-\u9fff]+")  # katakana (ー included) and kanji


def content_words(text: str) -> list[str]:
    """Character bigrams of each run of kanji or katakana (a run of one character counts as
    itself): the content words, without the hiragana particles and endings between them."""
    runs = CONTENT_RUN.findall(text)
    return [run[i : i + 2] for run in runs for i in range(max(len(run) - 1, 1))]


LANGUAGE = Language(
    code="ja",
    name="日本語",
    people=PEOPLE,
    days=DAYS,
    months=MONTHS,
    places=places,
    tasks=TASKS,
    defects=DEFECTS,
    contractors=contractors,
    ticket_prefix="WO",
    ticket_digits=4,
    amount=lambda yen: f"{yen * 10:,}円",
    date=date,
    openers=(
        "おはようございます。{home[name]}の件をまとめます。",
        "{home[name]}から戻りました。いくつか記録しておきます。",
        "{person}に頼まれて、{home[name]}の状況を確認します。",
        "{home[name]}について簡単に報告です。",
        "今日は{home[name]}の番です。始めましょう。",
        "週明けなので、まず{home[name]}から。",
        "帰る前に{home[name]}の件を片付けます。",
    ),
    talk={
        ("user", "place"): (
            "{person}は{day}まで{place[name]}に詰めています。",
            "{place[name]}の近所からまた騒音の苦情です。",
            "{place[name]}で昨日少し停電しましたが、こちらは問題なしです。",
            "{place[name]}の警備員が病欠で、{person}が代わりに入ってます。",
            "{person}が来週{place[name]}の荷主さんと打ち合わせしたいそうです。",
            "{place[name]}の新しいカゴ台車は届きましたか？",
        ),
        ("assistant", "place"): (
            "了解です、{place[name]}は見ておきます。",
            "承知しました、{day}に{place[name]}を入れます。",
            "わかりました、また何かあれば{person}に{place[name]}へ行ってもらいます。",
            "はい、{person}に伝えておきます。",
        ),
        ("user", "task"): (
            "{person}によると{place[name]}の{task[fact]}は順調だそうです。",
            "{task[fact]}は来月もいつも通りですか？",
            "{task[fact]}の資料は事務所の棚にあります。",
            "{person}が今月の{task[fact]}は誰がやるのか聞いてます。",
        ),
        ("assistant", "task"): (
            "記録しました、{task[fact]}の資料は{person}が管理します。",
            "はい、{task[fact]}もそろそろ時期ですね。",
            "了解、{person}に{task[fact]}の件をリマインドします。",
        ),
        ("user", "day"): (
            "{day}までは天気がいいらしいです。",
            "{person}は{day}から休暇です。",
            "事務所のプリンターがまた壊れました。",
            "まずコーヒーを一杯飲んでからにします。",
            "{person}と{person2}は今日一緒に巡回です。",
        ),
        ("assistant", "day"): (
            "はい、{day}にメモしました。",
            "了解です、{day}は{person}で。",
            "わかりました、{day}にまたフォローします。",
        ),
    },
    ask_before_lookup=(
        "{place[name]}でまだ終わってないものを調べてもらえますか？",
        "{place[name]}で最近何か新しいことはありますか？",
        "{place[name]}の記録を見てもらえますか？",
    ),
    leads={
        "user": ("", "そういえば、", "あと、", "忘れるところでした、"),
        "assistant": ("", "ありました：", "記録によると、", "はい、"),
    },
    facts={
        "ticket": (
            "{place[name]}の{defect[fact]}の件、修理依頼番号は{answer}です。",
            "{person}から{place[name]}で{defect[fact]}と連絡があり、{answer}で受付済みです。",
            "{place[name]}の{defect[fact]}、作業指示{answer}を発行しました。",
            "{place[name]}で{defect[fact]}、伝票 {answer} を切りました。",
        ),
        "owner": (
            "{place[name]}の{task[fact]}は今後{answer}に任せます。",
            "{place[name]}の{task[fact]}、担当は{answer}に決まりました。",
            "{task[fact]}の件、{place[name]}は{answer}と契約しました。{person}がサイン済みです。",
        ),
        "amount": (
            "{place[name]}の{task[fact]}の見積もりが来ました。{answer}です。",
            "{person}から{place[name]}の{task[fact]}の見積もり：{answer}。",
            "{place[name]}で{task[fact]}をやると{answer}かかるそうです。",
        ),
        "date": (
            "{place[name]}の{task[fact]}は{answer}に決まりました。",
            "{place[name]}の{task[fact]}、{answer}に業者が来ます。",
            "{person}が{place[name]}の{task[fact]}を{answer}で予約しました。掲示も済んでいます。",
        ),
    },
    question_context=(
        "",
        "{month}に話したと思うけど、",
        "{person}が{month}に言ってたこと。",
        "{home[name]}の話のときに出たやつ。",
        "前のことを聞きたいんだけど、",
    ),
    questions={
        "ticket": (
            "{place[name]}の{defect[asked]}ときの、登録コードは何でしたっけ？",
            "{place[name]}で{defect[asked]}とき、振られた管理IDを覚えてる？",
            "{defect[asked]}って話、{place[name]}のは何番で登録した？",
        ),
        "owner": (
            "{place[name]}の{task[asked]}、結局どこの会社にお願いしたんだっけ？",
            "{place[name]}の{task[asked]}はどこが引き受けてる？",
            "{task[asked]}、{place[name]}はどこに頼んだ？",
        ),
        "amount": (
            "{place[name]}の{task[asked]}、費用はいくら？",
            "{place[name]}の{task[asked]}にどのくらいお金がかかる？",
            "{place[name]}の{task[asked]}、値段っていくらだった？",
        ),
        "date": (
            "{place[name]}の{task[asked]}はいつ？",
            "{place[name]}の{task[asked]}、何日の何時から？",
            "{task[asked]}、{place[name]}の日程どうなってた？",
        ),
    },
    short_queries={  # an agent's keywords, separated by spaces as in a search box
        "ticket": "{place[name]} {defect[fact]} 番号",
        "owner": "{place[name]} {task[q_short]} 担当",
        "amount": "{place[name]} {task[fact]} 見積もり",
        "date": "{place[name]} {task[q_short]} 日程",
    },
    fillers={
        "user": (
            "ありがとう。",
            "とりあえず以上です。",
            "お疲れさまです。",
            "了解。",
            "では次へ。",
        ),
        "assistant": (
            "どういたしまして。",
            "承知しました。",
            "ほかに何かありますか？",
            "記録しました。",
            "こちらからは以上です。",
        ),
    },
    content_words=content_words,
    never_mentioned=(
        "うちの犬が最近ごはんを食べないけど、獣医さんは何て言ってた？",
        "前に日本橋で泊まったホテルはどこだっけ？",
        "娘のピアノの検定は何級だった？",
        "前におすすめされたSF小説のタイトルは？",
        "クレジットカードの締め日はいつ？",
        "結婚式には何人招待したんだっけ？",
        "あの四川料理の店の看板メニューは何？",
        "ジムのトレーナーが作った減量プランはどんな内容？",
        "去年の確定申告でいくら戻ってきた？",
        "パスポートの有効期限はいつまで？",
        "子どもの予防接種の2回目は済んだ？",
        "祖父の白内障の手術はどこの病院だった？",
    ),
    capitalise=False,
)
