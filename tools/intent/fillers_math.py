"""Math slot values for the intent data set: expressions and problems drawn with fresh numbers.

Code, not a table like fillers_en.toml: each value is drawn from the seeded generator, so the
order of the draws is part of the data set. Statements to prove are plain text: the `proofs`
tables of fillers_en.toml and fillers_zh.toml.
"""

# ruff: noqa: RUF001 (Chinese text uses full-width punctuation on purpose)

from __future__ import annotations

from random import Random


def expression(rng: Random) -> str:
    a, b, c = rng.randint(12, 999), rng.randint(2, 99), rng.randint(2, 30)
    return rng.choice(
        (
            f"{a} * {b}",
            f"{a} × {b}",
            f"{a} + {b} - {c}",
            f"({a} + {b}) / {c}",
            f"{b}^{rng.randint(2, 5)}",
            f"{b}/{c} + {c}/{b}",
            f"sqrt({b * b})",
            f"{a} ÷ {c}",
            f"{a}*{b}-{c}",
            f"2^{rng.randint(8, 20)}",
            f"{c}! / {rng.randint(2, 5)}!",
            f"log2({2 ** rng.randint(3, 12)})",
        )
    )


def equation(rng: Random) -> str:
    a, b, x = rng.randint(2, 12), rng.randint(1, 40), rng.randint(-9, 15)
    d = rng.randint(1, 9)
    return rng.choice(
        (
            f"{a}x + {b} = {a * x + b}",
            f"{a}x - {b} = {a * x - b}",
            f"{a + d}x - {b} = {d}x + {a * x - b}",
            f"{b} - {a}x = {b - a * x}",
            f"x/{a} + {b} = {b + d}",
            f"2^x = {2 ** rng.randint(2, 10)}",
            f"{a}(x - {d}) = {a * (x - d)}",
        )
    )


def quadratic(rng: Random) -> str:
    r, s = rng.randint(-9, 9), rng.randint(-9, 9)
    k = rng.choice((1, 1, 2, 3))
    p, q = -k * (r + s), k * r * s
    lead = "" if k == 1 else str(k)
    return f"{lead}x^2 {'+' if p >= 0 else '-'} {abs(p)}x {'+' if q >= 0 else '-'} {abs(q)} = 0"


def system(rng: Random) -> str:
    x, y = rng.randint(-5, 9), rng.randint(-5, 9)
    a, b, c, d = rng.randint(1, 6), rng.randint(1, 6), rng.randint(1, 6), rng.randint(1, 6)
    return f"{a}x + {b}y = {a * x + b * y}, {c}x - {d}y = {c * x - d * y}"


def function(rng: Random) -> str:
    a, k = rng.randint(2, 9), rng.randint(2, 6)
    return rng.choice(
        (
            "x^3 sin(x)",
            "e^(2x) ln(x)",
            "(x^2 + 1)/(x - 1)",
            "sqrt(1 + x^2)",
            "ln(cos x)",
            "x^x",
            f"arctan({a}x)",
            f"{a}x^{k} - {k}x + {a + k}",
            f"sin({a}x) cos(x)",
            f"e^(-x^2/{a})",
            f"(x^{k} - 1)^{a}",
            "x / (1 + e^x)",
        )
    )


def integrand(rng: Random) -> str:
    a, k = rng.randint(2, 9), rng.randint(1, 5)
    return rng.choice(
        (
            f"x^{k} from 0 to {a}",
            "1/(1 + x^2)",
            "x e^x",
            "sin^2(x)",
            "ln x",
            f"{a}x^{k} + {k}",
            "x cos(x)",
            f"1/(x^2 - {a * a})",
            "e^x sin(x)",
            f"sqrt({a} - x) from 0 to {a}",
        )
    )


def limit_en(rng: Random) -> str:
    a = rng.randint(2, 9)
    return rng.choice(
        (
            "the limit of sin(x)/x as x approaches 0",
            "lim (1 + 1/n)^n as n → ∞",
            f"the limit of (x^2 - {a * a})/(x - {a}) as x → {a}",
            "lim_{x→0} (e^x - 1)/x",
            f"the limit of (1 - cos({a}x))/x^2 as x goes to 0",
            f"lim x→∞ ({a}x^2 + 1)/(x^2 - {a})",
        )
    )


def limit_zh(rng: Random) -> str:
    a = rng.randint(2, 9)
    return rng.choice(
        (
            "当 x 趋于 0 时 sin(x)/x 的极限",
            "n 趋于无穷时 (1 + 1/n)^n 的极限",
            f"x→{a} 时 (x^2 - {a * a})/(x - {a}) 的极限",
            "lim_{x→0} (e^x - 1)/x",
            f"x 趋近于 0 时 (1 - cos{a}x)/x^2 的极限",
            f"x→∞ 时 ({a}x^2 + 1)/(x^2 - {a}) 的极限",
        )
    )


def numbers(rng: Random) -> str:
    values = [rng.randint(1, 99) for _ in range(rng.randint(5, 10))]
    return rng.choice((", ".join, " ".join, lambda v: "[" + ", ".join(v) + "]"))(map(str, values))


def matrix(rng: Random) -> str:
    size = rng.choice((2, 2, 3))
    rows = [[rng.randint(-5, 9) for _ in range(size)] for _ in range(size)]
    return "[" + ", ".join("[" + ", ".join(map(str, row)) + "]" for row in rows) + "]"


def percent_en(rng: Random) -> str:
    p, n = rng.choice((5, 12, 15, 17, 20, 35, 62, 80)), rng.randint(40, 5000)
    return rng.choice((f"{p}% of {n}", f"{n} increased by {p}%", f"{n} after a {p}% discount"))


def percent_zh(rng: Random) -> str:
    p, n = rng.choice((5, 12, 15, 17, 20, 35, 62, 80)), rng.randint(40, 5000)
    return rng.choice((f"{n} 的 {p}%", f"{n} 增加 {p}% 后", f"{n} 打 {10 - p // 10} 折后"))


def _train(rng: Random) -> str:
    d, t = rng.randint(120, 900), rng.choice((1.5, 2, 2.5, 3, 4))
    return f"A train travels {d} km in {t} hours. What is its average speed?"


def _discount(rng: Random) -> str:
    p, price = rng.choice((10, 20, 25, 30)), rng.randint(12, 400)
    return f"A jacket costs ${price} after a {p}% discount. What was the original price?"


def _interest(rng: Random) -> str:
    amount, rate, years = rng.randint(1, 50) * 1000, rng.choice((2, 3, 4, 5, 7)), rng.randint(2, 10)
    return (
        f"If I invest ${amount} at {rate}% interest compounded annually, how much will I have "
        f"after {years} years?"
    )


def _workers(rng: Random) -> str:
    a, b = rng.randint(3, 12), rng.randint(4, 15)
    return (
        f"One pipe fills a tank in {a} hours and another in {b} hours. How long do they take "
        "together?"
    )


def _ages(rng: Random) -> str:
    age, k = rng.randint(3, 15), rng.randint(2, 4)
    return (
        f"A mother is {k} times as old as her son. In {age} years she will be "
        f"{k - 1} times as old. How old are they now?"
    )


def _recipe(rng: Random) -> str:
    serves, target, flour = rng.randint(2, 6), rng.randint(7, 20), rng.randint(150, 600)
    return (
        f"A recipe for {serves} people needs {flour} g of flour. How much flour do I need for "
        f"{target} people?"
    )


def _fence(rng: Random) -> str:
    length = rng.randint(20, 200)
    return (
        f"A farmer has {length} m of fence to enclose a rectangular field along a river. What "
        "dimensions maximise the area?"
    )


def _salary(rng: Random) -> str:
    pay, raise_ = rng.randint(30, 120) * 1000, rng.choice((3, 5, 8, 10))
    return (
        f"My salary is ${pay} and I get a {raise_}% raise every year. What will it be in five "
        "years?"
    )


WORD_PROBLEMS_EN = (_train, _discount, _interest, _workers, _ages, _recipe, _fence, _salary)


def _chickens(rng: Random) -> str:
    chickens, rabbits = rng.randint(5, 40), rng.randint(5, 40)
    heads, legs = chickens + rabbits, 2 * chickens + 4 * rabbits
    return f"鸡兔同笼，共有 {heads} 个头，{legs} 条腿，问鸡和兔各有多少只？"


def _train_zh(rng: Random) -> str:
    d, t = rng.randint(120, 900), rng.choice((1.5, 2, 2.5, 3, 4))
    return f"一列火车 {t} 小时行驶了 {d} 千米，它的平均速度是多少？"


def _discount_zh(rng: Random) -> str:
    rate, price = rng.choice((7, 8, 9)), rng.randint(60, 900)
    return f"一件衣服打{rate}折后卖 {price} 元，原价是多少？"


def _interest_zh(rng: Random) -> str:
    amount, rate, years = rng.randint(1, 50), rng.choice((2, 3, 4, 5)), rng.randint(2, 10)
    return f"{amount} 万元存银行，年利率 {rate}%，按年复利，{years} 年后本息合计多少？"


def _pipes_zh(rng: Random) -> str:
    a, b = rng.randint(3, 12), rng.randint(4, 15)
    return f"一个水池，甲管单独注满要 {a} 小时，乙管单独注满要 {b} 小时，两管同时开，几小时注满？"


def _ages_zh(rng: Random) -> str:
    age, k = rng.randint(3, 15), rng.randint(2, 4)
    return (
        f"今年妈妈的年龄是儿子的 {k} 倍，{age} 年后妈妈的年龄是儿子的 {k - 1} 倍，两人今年各几岁？"
    )


def _work_zh(rng: Random) -> str:
    days, people = rng.randint(6, 30), rng.randint(3, 12)
    return f"{people} 个工人 {days} 天能完成一项工程，如果增加到 {people * 2} 人，需要几天？"


def _shop_zh(rng: Random) -> str:
    cost, price, count = rng.randint(20, 80), rng.randint(90, 200), rng.randint(50, 500)
    return f"某商品进价 {cost} 元，售价 {price} 元，卖出 {count} 件，利润率是多少？总利润多少？"


WORD_PROBLEMS_ZH = (
    _chickens,
    _train_zh,
    _discount_zh,
    _interest_zh,
    _pipes_zh,
    _ages_zh,
    _work_zh,
    _shop_zh,
)


def _dice(rng: Random) -> str:
    return f"What is the probability that two fair dice sum to {rng.randint(2, 12)}?"


def _coins(rng: Random) -> str:
    n = rng.randint(4, 12)
    return f"If I flip a fair coin {n} times, what is the probability of exactly {n // 2} heads?"


def _cards(rng: Random) -> str:
    k = rng.randint(2, 4)
    return (
        f"I draw {k} cards from a standard deck without replacement. "
        "What's the chance they are all aces?"
    )


def _birthday(rng: Random) -> str:
    return (
        f"In a room of {rng.randint(10, 60)} people, "
        "what is the probability that two share a birthday?"
    )


def _urn(rng: Random) -> str:
    red, blue = rng.randint(2, 9), rng.randint(2, 9)
    return (
        f"A bag has {red} red and {blue} blue balls. Two are drawn at random. "
        "What is the probability both are red?"
    )


PROBABILITY_EN = (_dice, _coins, _cards, _birthday, _urn)


def _dice_zh(rng: Random) -> str:
    return f"掷两个均匀的骰子，点数之和为 {rng.randint(2, 12)} 的概率是多少？"


def _coins_zh(rng: Random) -> str:
    n = rng.randint(4, 12)
    return f"抛一枚均匀硬币 {n} 次，恰好出现 {n // 2} 次正面的概率是多少？"


def _cards_zh(rng: Random) -> str:
    return f"从一副扑克牌（52 张）中不放回地抽 {rng.randint(2, 4)} 张，全是 A 的概率是多少？"


def _urn_zh(rng: Random) -> str:
    red, blue = rng.randint(2, 9), rng.randint(2, 9)
    return f"袋中有 {red} 个红球、{blue} 个蓝球，随机摸出两个，两个都是红球的概率是多少？"


def _lottery_zh(rng: Random) -> str:
    n, k = rng.randint(20, 40), rng.randint(3, 6)
    return f"从 {n} 个号码里选 {k} 个，一共有多少种选法？中奖概率是多少？"


PROBABILITY_ZH = (_dice_zh, _coins_zh, _cards_zh, _urn_zh, _lottery_zh)


def _circle(rng: Random) -> str:
    return f"What is the area of a circle with radius {rng.randint(2, 30)} cm?"


def _hypotenuse(rng: Random) -> str:
    return (
        f"A right triangle has legs of {rng.randint(3, 20)} and {rng.randint(3, 20)}. "
        "How long is the hypotenuse?"
    )


def _cylinder(rng: Random) -> str:
    return (
        f"Find the volume of a cylinder with radius {rng.randint(2, 10)} and height "
        f"{rng.randint(3, 25)}."
    )


def _choose(rng: Random) -> str:
    n = rng.randint(6, 30)
    return f"How many ways are there to choose {rng.randint(2, 5)} people out of {n}?"


def _gcd(rng: Random) -> str:
    return (
        f"What is the greatest common divisor of {rng.randint(12, 500)} and {rng.randint(12, 500)}?"
    )


def _binary(rng: Random) -> str:
    return f"Convert {rng.randint(20, 1000)} to binary by hand."


def _sequence(rng: Random) -> str:
    a, d = rng.randint(1, 9), rng.randint(2, 7)
    terms = ", ".join(str(a + d * i * i) for i in range(5))
    return f"What is the next number in the sequence {terms}, ...?"


def _modular(rng: Random) -> str:
    return f"Compute {rng.randint(2, 9)}^{rng.randint(50, 200)} mod {rng.choice((7, 11, 13, 17))}."


GEOMETRY_AND_MORE_EN = (
    _circle,
    _hypotenuse,
    _cylinder,
    _choose,
    _gcd,
    _binary,
    _sequence,
    _modular,
)


def _circle_zh(rng: Random) -> str:
    return f"半径为 {rng.randint(2, 30)} 厘米的圆，面积是多少？"


def _hypotenuse_zh(rng: Random) -> str:
    return f"直角三角形两条直角边分别为 {rng.randint(3, 20)} 和 {rng.randint(3, 20)}，求斜边长。"


def _cylinder_zh(rng: Random) -> str:
    return f"底面半径 {rng.randint(2, 10)}、高 {rng.randint(3, 25)} 的圆柱体积是多少？"


def _choose_zh(rng: Random) -> str:
    return f"从 {rng.randint(6, 30)} 个人中选 {rng.randint(2, 5)} 个人，有多少种选法？"


def _gcd_zh(rng: Random) -> str:
    return f"求 {rng.randint(12, 500)} 和 {rng.randint(12, 500)} 的最大公约数和最小公倍数。"


def _sequence_zh(rng: Random) -> str:
    a, d = rng.randint(1, 9), rng.randint(2, 7)
    terms = "，".join(str(a + d * i) for i in range(5))
    return f"等差数列 {terms}，…… 的第 {rng.randint(20, 100)} 项是多少？前 n 项和呢？"


def _modular_zh(rng: Random) -> str:
    base, power, modulus = rng.randint(2, 9), rng.randint(50, 200), rng.choice((7, 11, 13))
    return f"{base} 的 {power} 次方除以 {modulus} 的余数是多少？"


GEOMETRY_AND_MORE_ZH = (
    _circle_zh,
    _hypotenuse_zh,
    _cylinder_zh,
    _choose_zh,
    _gcd_zh,
    _sequence_zh,
    _modular_zh,
)
