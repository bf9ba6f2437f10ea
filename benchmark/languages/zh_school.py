"""Chinese, a second history (issue 34): another domain and another phrasing than ``zh.py``,
written before anything was tuned on it. A middle school's teachers in their grade group's chat
(年级组群): classes instead of buildings ("初二3班", "高一12班"), school jobs (a spring outing, the
health check, a parents' lecture) and classroom breakdowns reported to the school's facilities
office, whose order numbers are short ("K-039"). Colloquial: 啥, 咋, 呗, 咱们; amounts in 块,
times written with a colon ("4月18日下午2:30"); questions often put the subject after the ask,
and the short queries are typed without spaces ("初二3班投影仪不亮报修编号"). The paraphrase
rule's units are character bigrams, as in ``zh.py``."""

# ruff: noqa: SIM905  (text tables: one term or template a line, words split from a block)
from __future__ import annotations

import random

from benchmark.languages import Forms, Language, firms, han_words, term_table
from benchmark.languages.zh import NEVER_MENTIONED  # the same personal topics

PEOPLE = ("王老师", "刘主任", "陈老师", "赵校长", "孙老师", "周主任",
          "吴老师", "郑老师", "小冯", "何老师", "韩主任", "小许")  # fmt: skip
GRADES = ("初一", "初二", "初三", "高一", "高二", "高三")
FIRM_NAMES = (
    "启航", "育才", "博学", "明德", "睿思", "新蕾", "远航", "启迪", "乐学", "优贝", "童心",
    "金苹果", "小树苗", "未来星", "知行", "致知", "弘毅", "思源", "青禾", "智联", "晨曦", "正大",
    "嘉园", "诺亚", "蓝天", "海韵", "朗润", "鸿鹄", "麦田", "方舟",
)  # fmt: skip
FIRM_KINDS = ("旅行社", "教育", "后勤公司", "餐饮", "科技")
MONTHS = tuple(f"{m}月份" for m in range(1, 13))
DAYS = ("周一", "周二", "周三", "周四", "周五")


def places(rng: random.Random, count: int) -> list[Forms]:
    classes = [f"{grade}{n}班" for grade in GRADES for n in range(1, 25)]
    if count > len(classes):
        raise ValueError(f"too many conversations: {count} classes needed, {len(classes)} named")
    return [{"name": name} for name in rng.sample(classes, count)]


contractors = firms(FIRM_NAMES, FIRM_KINDS)


def date(month: int, day: int, hour: int, minute: int) -> str:
    period = "上午" if hour < 12 else "中午" if hour == 12 else "下午"
    return f"{month}月{day}日{period}{hour if hour <= 12 else hour - 12}:{minute:02d}"


TASKS = term_table("""
春游 | 带学生去郊外踏青 | 郊外踏青
体检 | 给孩子们量身高测视力 | 量身高测视力
校服订购 | 统一服装采买 | 统一服装采买
教室消毒 | 上课那间屋子杀菌清洁 | 屋子杀菌
空调清洗 | 冷气机滤网除尘 | 冷气机滤网
拍集体照 | 全班合影留念 | 全班合影
课后托管 | 放学以后看着娃写作业 | 放学看娃
研学旅行 | 出去参观博物馆那种实践活动 | 参观博物馆
午餐配送 | 送盒饭到班上 | 送盒饭
校车接送 | 早晚载孩子上下学那趟大巴 | 上下学大巴
运动会 | 田径比赛那天 | 田径比赛
心理讲座 | 请专家来讲怎么调节情绪 | 调节情绪讲课
""")  # fmt: skip
DEFECTS = term_table("""
投影仪不亮 | 上课放PPT那台机器黑屏 | 放PPT机器黑屏
空调漏水 | 墙上那台制冷机子淌水 | 制冷机子淌水
课桌椅坏了 | 学生坐那板凳散架了 | 板凳散架
黑板灯不亮 | 讲台上方照明管子熄了 | 讲台照明熄了
窗户玻璃碎了 | 窗子裂了条缝 | 窗子裂缝
饮水机坏了 | 接热水那台机器不出水 | 接热水不出水
门锁坏了 | 进出那扇门关不严 | 门关不严
电脑死机 | 讲台上主机老卡住 | 主机卡住
广播没声音 | 喇叭里听不到响动 | 喇叭没响动
天花板掉灰 | 头顶墙皮往下落 | 头顶墙皮脱落
""")  # fmt: skip
# Bigrams that carry no content (particles, pronouns, question words), for the paraphrase rule.
STOP_BIGRAMS = frozenset("""
我们 你们 他们 咱们 一下 什么 多少 这个 那个 那台 那次 已经 时候 一次 现在 是谁 了吗 来着
""".split())  # fmt: skip


content_words = han_words(STOP_BIGRAMS)


LANGUAGE = Language(
    code="zh_school",
    name="中文（学校）",
    people=PEOPLE,
    days=DAYS,
    months=MONTHS,
    places=places,
    tasks=TASKS,
    defects=DEFECTS,
    contractors=contractors,
    ticket_prefix="K",
    ticket_digits=3,
    amount=lambda yuan: f"{yuan}块",
    date=date,
    openers=(
        "各位老师好，{home[name]}这边说几句。",
        "刚下课，{home[name]}有点事跟你对一下。",
        "{person}让我问问{home[name]}的情况。",
        "{home[name]}今天的事，我简单过一遍哈。",
        "早，先说{home[name]}。",
        "开完年级会了，{home[name]}有几条要记。",
        "晚自习前，把{home[name]}的事弄完吧。",
    ),
    talk={
        ("user", "place"): (
            "{place[name]}这周{day}要换座位。",
            "{place[name]}有个家长又打电话来了。",
            "{person}{day}去{place[name]}听课。",
            "{place[name]}的班长请假了，{person}先管着。",
            "{place[name]}月考平均分上来了不少。",
            "{place[name]}新发的练习册到了没？",
        ),
        ("assistant", "place"): (
            "好嘞，{place[name]}我盯着点。",
            "行，{day}把{place[name]}排上。",
            "知道了，回头让{person}去{place[name]}转一圈。",
            "嗯，我跟{person}说一声。",
        ),
        ("user", "task"): (
            "{person}说{place[name]}的{task[fact]}挺顺的。",
            "{task[fact]}下学期还搞吗？",
            "{task[fact]}的通知在教务处。",
            "{person}问今年{task[fact]}谁牵头。",
        ),
        ("assistant", "task"): (
            "记下了，{task[fact]}的材料{person}收着。",
            "好，{task[fact]}又快到了。",
            "行，我提醒{person}{task[fact]}那事儿。",
        ),
        ("user", "day"): (
            "听说{day}降温，多穿点。",
            "{person}{day}开始请产假。",
            "办公室复印机又卡纸了。",
            "先去食堂吃口饭再聊。",
            "{person}和{person2}今天一起监考。",
        ),
        ("assistant", "day"): (
            "好，记在{day}。",
            "行，{day}让{person}来。",
            "明白，{day}再跟。",
        ),
    },
    ask_before_lookup=(
        "帮我翻翻{place[name]}还有啥没弄完的？",
        "{place[name]}最近有啥动静？",
        "看下{place[name]}的记录呗。",
    ),
    leads={
        "user": ("", "哦对，", "另外，", "差点忘说，"),
        "assistant": ("", "找到了：", "记录上是：", "有的，"),
    },
    facts={
        "ticket": (
            "{place[name]}{defect[fact]}，后勤登了，编号{answer}。",
            "{person}说{place[name]}{defect[fact]}，报上去了，单子是{answer}。",
            "{answer}，这个是{place[name]}{defect[fact]}的报修号。",
            "{place[name]}又{defect[fact]}，我提交了 {answer}，等人来修。",
        ),
        "owner": (
            "{place[name]}的{task[fact]}定了，{answer}包了。",
            "{task[fact]}这事儿，{place[name]}找的是{answer}。",
            "{answer}中标了，{place[name]}的{task[fact]}归他们。",
            "{place[name]}{task[fact]}那块现在是{answer}在弄，{person}签的字。",
        ),
        "amount": (
            "{place[name]}{task[fact]}，{answer}，{person}已经报给财务了。",
            "{task[fact]}的钱算出来了，{place[name]}一共{answer}。",
            "{place[name]}搞{task[fact]}得{answer}，家长那边没意见。",
        ),
        "date": (
            "{place[name]}{task[fact]}排在{answer}。",
            "{answer}，{place[name]}{task[fact]}，别忘了。",
            "{person}定了，{place[name]}的{task[fact]}放在{answer}。",
        ),
    },
    question_context=(
        "",
        "上学期聊过的，",
        "{person}在群里提过，",
        "{month}那阵子说过：",
        "想起来{home[name]}那回聊天，",
    ),
    questions={
        "ticket": (
            "{place[name]}{defect[asked]}那回，报的号是啥？",
            "诶，{defect[asked]}，{place[name]}那个单号你还有没？",
            "{place[name]}{defect[asked]}，当时登记编码多少？",
        ),
        "owner": (
            "{place[name]}{task[asked]}，最后谁家接的活？",
            "{task[asked]}那个，{place[name]}后来交给哪家了？",
            "{place[name]}{task[asked]}咱们请的哪个机构啊？",
        ),
        "amount": (
            "{place[name]}{task[asked]}花了多少？",
            "问下，{place[name]}{task[asked]}要价几何？",
            "{place[name]}{task[asked]}，人家开价多少啊？",
        ),
        "date": (
            "{place[name]}{task[asked]}啥时候？",
            "{task[asked]}，{place[name]}是哪天几点？",
            "咋安排的，{place[name]}{task[asked]}在哪一天？",
        ),
    },
    short_queries={  # typed as one run, no spaces: a user's own search words
        "ticket": "{place[name]}{defect[fact]}报修编号",
        "owner": "{place[name]}{task[q_short]}谁负责",
        "amount": "{place[name]}{task[fact]}多少钱",
        "date": "{place[name]}{task[q_short]}哪天",
    },
    fillers={
        "user": ("谢啦。", "就这些。", "辛苦辛苦。", "好。", "接着说。"),
        "assistant": ("不客气。", "收到。", "还有别的不？", "记上了。", "我这边没了。"),
    },
    content_words=content_words,
    never_mentioned=NEVER_MENTIONED,
    capitalise=False,
)
