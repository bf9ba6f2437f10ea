"""Chinese (written Mandarin, as colleagues type in a work chat): a property-management office
(物业) and its estates. Buildings are an estate and a block ("翠湖花园3号楼"); no spaces between
words, Chinese punctuation, numbers in Arabic digits as chat writes them ("4380元",
"3月14号下午2点半"), ids as they appear ("报修单号BX-20417", sometimes with a space before).
The paraphrases use other words, not other characters of one word ("电梯维保" / "升降梯的定期
保养"); the paraphrase rule's units are character bigrams, since nothing marks a word."""

# ruff: noqa: SIM905  (text tables: one term or template a line, words split from a block)
from __future__ import annotations

import random

from benchmark.languages import Forms, Language, firms, han_words, term_table

PEOPLE = ("小王", "老李", "张姐", "刘工", "陈经理", "小赵",
          "周师傅", "孙会计", "老吴", "小林", "何主管", "马师傅")  # fmt: skip
ESTATES = (
    "阳光", "翠湖", "金桂", "银杏", "锦绣", "枫林", "碧水", "紫荆", "丽景", "青松", "东湖", "西山",
    "北辰", "海棠", "梧桐", "玉兰", "翡翠", "怡景", "康乐", "明珠", "星河", "绿洲", "香榭", "御景",
    "春晓", "凤凰", "柳岸", "荷塘", "松涛", "云栖", "望江", "临湖", "滨河", "文华", "书香", "金域",
    "湖畔", "景泰", "嘉禾", "泰和", "瑞景", "朝阳", "清泉", "桃源", "悦澜", "晴川", "蓝湾", "橡树",
)  # fmt: skip
ESTATE_KINDS = ("花园", "小区", "家园", "公寓", "新村", "名苑")
FIRM_NAMES = (
    "宏达", "鑫源", "恒通", "佳美", "安居", "永盛", "瑞丰", "兴旺", "顺发", "利民", "华信", "德润",
    "诚信", "益家", "众合", "大成", "盛世", "万通", "金盾", "天成", "广厦", "新锐", "博远", "致远",
    "卓越", "昌隆", "福满", "久安", "立信", "同创", "华阳", "东升", "启明", "鼎盛", "长青", "信达",
    "腾飞", "祥和", "汇通", "美家",
)  # fmt: skip
FIRM_KINDS = ("机电", "保洁公司", "工程队", "维修部", "物业服务")
MONTHS = tuple(f"{m}月" for m in range(1, 13))
DAYS = ("周一", "周二", "周三", "周四", "周五", "周六")


def places(rng: random.Random, count: int) -> list[Forms]:
    estates = [estate + kind for estate in ESTATES for kind in ESTATE_KINDS]  # "翠湖小区" too
    if count > len(estates):
        raise ValueError(f"too many conversations: {count} buildings needed, {len(estates)} named")
    out = []
    for estate in rng.sample(estates, count):
        block = rng.choice((f"{rng.randrange(1, 20)}号楼", f"{rng.randrange(1, 20)}栋"))
        out.append({"name": f"{estate}{block}"})
    return out


contractors = firms(FIRM_NAMES, FIRM_KINDS)


def date(month: int, day: int, hour: int, minute: int) -> str:
    period = "上午" if hour < 12 else "中午" if hour == 12 else "下午"
    return f"{month}月{day}号{period}{hour if hour <= 12 else hour - 12}点{'半' if minute else ''}"


TASKS = term_table("""
锅炉年检 | 给供暖设备做的年度检查 | 供暖设备检查
天沟清理 | 把屋檐排水槽掏干净 | 屋檐排水槽
楼道保洁 | 每周拖洗楼梯和走廊 | 拖洗楼梯
电梯维保 | 升降梯的定期保养 | 升降梯保养
消防检查 | 灭火器和烟感的例行查验 | 灭火器查验
水箱清洗 | 给楼顶蓄水池消毒 | 蓄水池消毒
树木修剪 | 给院子里的树剪枝 | 树剪枝
绿化养护 | 浇花除草这些园艺活 | 浇花除草
灭蟑消杀 | 除虫打药 | 除虫打药
抄水电表 | 登记各户的用水用电读数 | 用水用电读数
屋面防水检查 | 上楼顶看看瓦片和防渗层 | 楼顶防渗层
地库清扫 | 打扫地下停车场 | 地下停车场打扫
""")  # fmt: skip
DEFECTS = term_table("""
地下室漏水 | 负一层墙面渗水发潮 | 负一层墙面渗水
电梯故障 | 升降梯卡在半路不动了 | 升降梯卡住
门禁对讲坏了 | 楼下按铃屋里听不见 | 按铃听不见
下水管堵塞 | 排污管道不通 | 排污管道不通
顶楼渗漏 | 最上层天花板往下滴水 | 天花板滴水
楼道灯闪烁 | 走廊照明一会儿亮一会儿灭 | 走廊照明忽亮忽灭
单元门关不上 | 入口那扇门锁不住 | 入口门锁不住
卫生间发霉 | 洗手间顶上长黑斑 | 洗手间黑斑
暖气不热 | 散热片摸着是凉的 | 散热片凉
信报箱被撬 | 邮箱让人给撬坏了 | 邮箱撬坏
""")  # fmt: skip
# Bigrams that carry no content (particles, pronouns, question words), for the paraphrase rule.
STOP_BIGRAMS = frozenset("""
我们 你们 他们 一下 什么 多少 这个 那个 这些 那些 的事 事情 已经 时候 一次 现在 是谁 的是 了吗
""".split())  # fmt: skip


# Questions about what no conversation of the history touches (a pet, a trip, a passport): a
# search should find nothing for them (benchmark/languages/stages.py counts those shown passages).
NEVER_MENTIONED = (
    "我家狗最近不爱吃东西，兽医怎么说的？",
    "上次去日本旅游订的是哪家酒店？",
    "我女儿钢琴考级是几级来着？",
    "之前推荐的那本科幻小说叫什么名字？",
    "我的信用卡账单日是几号？",
    "我们婚礼请了多少桌客人？",
    "那家川菜馆的招牌菜是什么？",
    "健身教练给我定的减脂计划是怎样的？",
    "去年报税的时候退了多少钱？",
    "我的护照什么时候过期？",
    "孩子的疫苗第二针打了没有？",
    "爷爷做白内障手术是在哪家医院？",
)


content_words = han_words(STOP_BIGRAMS)


LANGUAGE = Language(
    code="zh",
    name="中文",
    people=PEOPLE,
    days=DAYS,
    months=MONTHS,
    places=places,
    tasks=TASKS,
    defects=DEFECTS,
    contractors=contractors,
    ticket_prefix="BX",
    amount=lambda yuan: f"{yuan}元",
    date=date,
    openers=(
        "早上好，我在{home[name]}，过一下今天的事。",
        "刚从{home[name]}回来，有几件事记一下。",
        "{person}让我跟你对一下{home[name]}的情况。",
        "{home[name]}这边简单汇报一下。",
        "今天轮到{home[name]}了，开始吧。",
        "新的一周，先从{home[name]}说起。",
        "快下班了，走之前把{home[name]}的事说完。",
    ),
    talk={
        ("user", "place"): (
            "{person}到{day}都在{place[name]}值班。",
            "{place[name]}的业主又投诉噪音了。",
            "{place[name]}昨天停了一会儿电，我们这边没事。",
            "{place[name]}的保安请病假了，{person}先顶着。",
            "{person}下周想跟{place[name]}的业委会碰个头。",
            "{place[name]}新的垃圾桶到了没有？",
        ),
        ("assistant", "place"): (
            "好的，{place[name]}我会盯着。",
            "收到，{day}把{place[name]}排上。",
            "明白，要是再出问题可以让{person}去{place[name]}看看。",
            "行，我跟{person}说一声。",
        ),
        ("user", "task"): (
            "{person}说{place[name]}的{task[fact]}挺顺利的。",
            "{task[fact]}下个月还照常吗？",
            "{task[fact]}的资料在办公室柜子里。",
            "{person}问这个月的{task[fact]}谁来做。",
        ),
        ("assistant", "task"): (
            "记下了，{task[fact]}的资料由{person}保管。",
            "好，{task[fact]}快又到时间了。",
            "行，我提醒{person}{task[fact]}的事。",
        ),
        ("user", "day"): (
            "听说天气能一直好到{day}。",
            "{person}{day}开始休假。",
            "办公室的打印机又坏了。",
            "先喝口咖啡，再说别的。",
            "{person}和{person2}今天一起出去巡楼。",
        ),
        ("assistant", "day"): (
            "好，我记在{day}。",
            "好的，{day}就安排{person}。",
            "明白，{day}我再跟进。",
        ),
    },
    ask_before_lookup=(
        "帮我查一下{place[name]}还有哪些没办完的？",
        "{place[name]}最近有什么新情况？",
        "麻烦看看{place[name]}的记录。",
    ),
    leads={
        "user": ("", "对了，", "还有，", "差点忘了，"),
        "assistant": ("", "查到了：", "记录里写着：", "是的，"),
    },
    facts={
        "ticket": (
            "{place[name]}{defect[fact]}的事，报修单号{answer}，师傅已经通知了。",
            "{person}报了{place[name]}的{defect[fact]}，单号是{answer}。",
            "{place[name]}{defect[fact]}已经开了工单{answer}。",
            "{place[name]}那边{defect[fact]}，我建了维修单 {answer}。",
        ),
        "owner": (
            "{place[name]}的{task[fact]}以后交给{answer}了。",
            "{place[name]}{task[fact]}这块，现在由{answer}负责。",
            "{task[fact]}那边定了，{place[name]}由{answer}来做，{person}已经签了合同。",
            "{place[name]}的{task[fact]}外包给{answer}了。",
        ),
        "amount": (
            "{place[name]}{task[fact]}的报价出来了，{answer}。",
            "{person}发来了{place[name]}{task[fact]}的报价：{answer}。",
            "{place[name]}做{task[fact]}，对方报了{answer}。",
        ),
        "date": (
            "{place[name]}{task[fact]}定在{answer}。",
            "{place[name]}的{task[fact]}约好了，{answer}上门。",
            "{person}把{place[name]}{task[fact]}排到了{answer}，通知已经贴出去了。",
        ),
    },
    question_context=(
        "",
        "{month}的时候聊过这个。",
        "{person}{month}提过这事。",
        "想起之前关于{home[name]}的一次聊天。",
        "问一件以前的事：",
    ),
    questions={
        "ticket": (
            "{place[name]}{defect[asked]}那件事，登记编号多少来着？",
            "{place[name]}{defect[asked]}，当时开的受理号还记得吗？",
            "我想查一下{place[name]}{defect[asked]}对应的登记编号。",
        ),
        "owner": (
            "{place[name]}{task[asked]}，后来是哪家在管？",
            "{place[name]}{task[asked]}我们请的是哪个单位？",
            "谁接手了{place[name]}{task[asked]}？",
        ),
        "amount": (
            "{place[name]}{task[asked]}，人家要价多少？",
            "{place[name]}{task[asked]}大概得花多少钱？",
            "{place[name]}{task[asked]}的费用是多少来着？",
        ),
        "date": (
            "{place[name]}{task[asked]}，师傅哪天过来？",
            "{place[name]}{task[asked]}是几号几点？",
            "{task[asked]}，{place[name]}安排在什么时候？",
        ),
    },
    short_queries={  # an agent's keywords, separated by spaces as in a search box
        "ticket": "{place[name]} {defect[fact]} 报修单",
        "owner": "{place[name]} {task[q_short]} 哪家公司",
        "amount": "{place[name]} {task[fact]} 报价",
        "date": "{place[name]} {task[q_short]} 时间",
    },
    fillers={
        "user": ("谢谢。", "先这样吧。", "好的，辛苦了。", "行。", "那我们继续。"),
        "assistant": ("不客气。", "收到。", "好的，还有别的吗？", "已记录。", "好，我这边就这些。"),
    },
    content_words=content_words,
    never_mentioned=NEVER_MENTIONED,
    capitalise=False,
)
